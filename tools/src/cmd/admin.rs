//! `orbitkv admin`: talks to a running daemon over its control socket — its metrics, a
//! namespace retirement, a sync.

use std::path::PathBuf;

use clap::{Args, Subcommand};
use orbitkv_manager::client::{Client, ClientError};
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

/// Metric lines (`name value`, `name{labels} value`) as an object.
fn metrics_object(text: &str) -> Value {
    let mut m = Map::new();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        if let Some((name, value)) = line.rsplit_once(' ')
            && let Ok(v) = value.parse::<u64>()
        {
            m.insert(name.to_owned(), json!(v));
        }
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
