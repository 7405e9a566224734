//! `orbitkv admin`: talks to a running daemon over its control socket — its metrics, a
//! namespace retirement, a sync.

use std::path::PathBuf;

use clap::{Args, Subcommand};
use orbitkv_protocol::client::{Client, ClientError};
use orbitkv_state::{Namespace, hex};
use serde_json::{Map, Value, json};

use crate::Failure;
use crate::output::Output;

/// `admin` arguments.
#[derive(Args)]
pub struct AdminArgs {
    /// The daemon's control socket.
    #[arg(
        long,
        value_name = "PATH",
        default_value = "./orbitkv-data/orbitkv.sock",
        global = true
    )]
    socket: PathBuf,
    #[command(subcommand)]
    cmd: AdminCommand,
}

/// What to ask the daemon.
#[derive(Subcommand)]
pub enum AdminCommand {
    /// Print the daemon's metrics (Prometheus text; with --json an object of metric → value).
    Stats,
    /// Retire a namespace: none of its older records is served again.
    Retire {
        /// The namespace (64 hex digits, as `inspect` shows it).
        #[arg(long, value_name = "HEX")]
        namespace: String,
    },
    /// Make every accepted publish durable.
    Sync,
}

fn failure(socket: &std::path::Path, e: ClientError) -> Failure {
    match e {
        ClientError::Io(e) => Failure::refused(format!(
            "{}: cannot reach a daemon: {e} (is `orbitkv serve` running?)",
            socket.display()
        )),
        ClientError::Refused { detail, .. } => {
            Failure::refused(format!("the daemon refused: {detail}"))
        }
        other => Failure::internal(other.to_string()),
    }
}

/// Metric lines (`name value`, `name{labels} value`) as an object; comment lines (`# HELP`,
/// `# TYPE`, `# EOF`) are skipped.
fn metrics_object(text: &str) -> Value {
    let mut m = Map::new();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((name, value)) = line.rsplit_once(' ') else {
            continue;
        };
        // Counts stay integers; a histogram's sum is written as a float (`0.0`, `1.5e-5`).
        let v = match value.parse::<u64>() {
            Ok(v) => json!(v),
            Err(_) => match value.parse::<f64>() {
                Ok(v) if v.is_finite() => json!(v),
                _ => continue,
            },
        };
        m.insert(name.to_owned(), v);
    }
    Value::Object(m)
}

/// Runs an admin command.
pub fn run(a: &AdminArgs, out: &Output) -> Result<(), Failure> {
    let fail = |e| failure(&a.socket, e);
    let mut c = Client::connect(&a.socket).map_err(fail)?;
    c.hello("orbitkv admin").map_err(fail)?;
    match &a.cmd {
        AdminCommand::Stats => {
            let text = c.stats().map_err(fail)?;
            out.emit(&text, || metrics_object(&text))
        }
        AdminCommand::Retire { namespace } => {
            let ns = Namespace(
                hex::decode_array(namespace, "--namespace")
                    .map_err(|e| Failure::refused(e.to_string()))?,
            );
            let watermark = c.retire(ns.0).map_err(fail)?;
            out.emit(
                &format!("retired {ns}: records below sequence {watermark} are dead\n"),
                || json!({ "namespace": ns.to_string(), "watermark": watermark }),
            )
        }
        AdminCommand::Sync => {
            c.sync().map_err(fail)?;
            out.emit("synced\n", || json!({ "synced": true }))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::metrics_object;
    use serde_json::json;

    #[test]
    fn metric_lines_become_numbers_and_comments_are_skipped() {
        let text = "# HELP orbitkv_queries_total Queries.\n# TYPE orbitkv_queries_total counter\n\
                    orbitkv_queries_total 3\n\
                    orbitkv_request_seconds_bucket{kind=\"load\",le=\"+Inf\"} 2\n\
                    orbitkv_request_seconds_sum{kind=\"load\"} 0.0\n\
                    orbitkv_request_seconds_sum{kind=\"query\"} 2.5e-5\n\
                    not a number\n# EOF\n";
        assert_eq!(
            metrics_object(text),
            json!({
                "orbitkv_queries_total": 3,
                "orbitkv_request_seconds_bucket{kind=\"load\",le=\"+Inf\"}": 2,
                "orbitkv_request_seconds_sum{kind=\"load\"}": 0.0,
                "orbitkv_request_seconds_sum{kind=\"query\"}": 2.5e-5,
            })
        );
    }
}
