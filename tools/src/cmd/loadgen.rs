//! `orbitkv loadgen`: N simulated engines of one computation, each its own instance and
//! connections, replaying a trace (or synthetic requests) against a running daemon
//! concurrently. `--json` prints exactly one object: requests, errors, hits, wrong_bytes and
//! the request latency's p50 and p99 in microseconds; the text output adds misses by reason,
//! the hit ratio in tokens and the throughput.

use std::time::{Duration, Instant};

use clap::Args;
use orbitkv_sim::{Report, SimEngine};
use serde_json::json;

use super::engine_sim::{InstanceArgs, report_text, verdict};
use crate::Failure;
use crate::output::Output;

/// `loadgen` arguments.
#[derive(Args)]
pub struct LoadgenArgs {
    #[command(flatten)]
    instance: InstanceArgs,
    /// Concurrent simulated engines.
    #[arg(long, value_name = "N", default_value_t = 8,
          value_parser = clap::value_parser!(u32).range(1..=256))]
    clients: u32,
    /// Requests in all [default: 256 synthetic, or the whole trace]; dealt to the clients in
    /// turn, in trace order.
    #[arg(long, value_name = "M")]
    requests: Option<usize>,
    /// Stop starting requests after this many seconds.
    #[arg(long, value_name = "SECS")]
    duration: Option<f64>,
}

/// Runs `loadgen`.
pub fn run(a: &LoadgenArgs, out: &Output) -> Result<(), Failure> {
    let requests = a.instance.requests(a.requests, 256)?;
    if requests.is_empty() {
        return Err(Failure::refused("no requests to send"));
    }
    let clients = a.clients as usize;
    let deadline = a
        .duration
        .map(|s| Instant::now() + Duration::from_secs_f64(s.max(0.0)));
    let started = Instant::now();
    let results: Vec<(Report, Option<String>)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..clients)
            .map(|c| {
                let name = format!("loadgen-{}-{c}", std::process::id());
                let (args, requests) = (&a.instance, &requests);
                scope.spawn(move || -> Result<(Report, Option<String>), Failure> {
                    let inst = args.instance(&name)?;
                    let mut engine = SimEngine::start(args.options(inst))
                        .map_err(|e| Failure::refused(format!("{}: {e}", args.socket.display())))?;
                    let mut error = None;
                    for i in (c..requests.len()).step_by(clients) {
                        if deadline.is_some_and(|d| Instant::now() >= d) {
                            break;
                        }
                        if let Err(e) = engine.run(&requests.tokens(i)) {
                            error = Some(format!("{name}: {e}"));
                            break;
                        }
                    }
                    Ok((engine.report().clone(), error))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| match h.join() {
                Ok(Ok(r)) => r,
                Ok(Err(f)) => (
                    Report {
                        errors: 1,
                        ..Report::default()
                    },
                    Some(f.message),
                ),
                Err(_) => (
                    Report {
                        errors: 1,
                        ..Report::default()
                    },
                    Some("a client thread panicked".to_owned()),
                ),
            })
            .collect()
    });
    let seconds = started.elapsed().as_secs_f64();
    let mut total = Report::default();
    let mut first_error = None;
    for (r, e) in &results {
        total.merge(r);
        if first_error.is_none() {
            first_error.clone_from(e);
        }
    }
    let text = format!(
        "clients: {clients}\n{}throughput: {:.1} requests/s, {:.1} MB/s loaded, {:.1} MB/s published ({seconds:.2} s)\n",
        report_text(&total),
        total.requests as f64 / seconds.max(1e-9),
        total.pages.loaded_bytes as f64 / seconds.max(1e-9) / 1e6,
        total.pages.published_bytes as f64 / seconds.max(1e-9) / 1e6,
    );
    out.emit(&text, || {
        json!({
            "requests": total.requests,
            "errors": total.errors,
            "hits": total.hits,
            "wrong_bytes": total.pages.wrong_bytes,
            "p50_us": total.percentile_us(50.0),
            "p99_us": total.percentile_us(99.0),
        })
    })?;
    verdict(&total, first_error)
}
