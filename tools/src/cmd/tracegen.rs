//! `orbitkv bench trace-gen` writes a synthetic Mooncake-format trace of one shape
//! (`crate::tracegen`). `orbitkv bench trace-stats` prints how traces reuse their blocks, so a
//! generated shape can be set beside a real trace.

use std::io::Write;
use std::path::PathBuf;

use clap::Args;
use serde_json::{Value, json};

use crate::Failure;
use crate::output::Output;
use crate::tracegen::{Params, Shape, Stats, generate, stats};

/// `bench trace-gen`.
#[derive(Args)]
pub struct TraceGenArgs {
    /// The workload's shape.
    #[arg(long, value_enum)]
    shape: Shape,
    /// The seed (the same arguments and seed write the same trace).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Requests.
    #[arg(long, default_value_t = 10_000)]
    requests: usize,
    /// Users active at once (default 64).
    #[arg(long)]
    users: Option<usize>,
    /// Blocks of a shared prompt or a document (default 8).
    #[arg(long)]
    shared_blocks: Option<u64>,
    /// Mean blocks of a new message (default 2).
    #[arg(long)]
    message_blocks: Option<u64>,
    /// Mean blocks of an answer (default 1).
    #[arg(long)]
    answer_blocks: Option<u64>,
    /// Distinct shared prompts or documents (default 4).
    #[arg(long)]
    prompts: Option<usize>,
    /// Turns of a conversation (default 8).
    #[arg(long)]
    turns: Option<usize>,
    /// Mean think time between a user's turns, ms (default 30000).
    #[arg(long)]
    think_ms: Option<u64>,
    /// Where the trace goes (JSON lines).
    #[arg(long, value_name = "FILE")]
    out: PathBuf,
}

/// `bench trace-stats`.
#[derive(Args)]
pub struct TraceStatsArgs {
    /// Traces (JSON lines with `hash_ids`).
    #[arg(required = true, value_name = "FILE")]
    traces: Vec<PathBuf>,
}

fn doc(name: &str, s: &Stats) -> Value {
    json!({
        "trace": name,
        "requests": s.requests,
        "references": s.references,
        "distinct": s.distinct,
        "reuse_fraction": s.reuse_fraction,
        "reuse_distance_p50_p90_p99": s.reuse_distance,
        "shared_prefix_mean_p90": s.shared_prefix,
        "shared_fraction": s.shared_fraction,
    })
}

fn line(name: &str, s: &Stats) -> String {
    format!(
        "{name}: {} requests, {} block references, {} distinct; reuses {:.3} of references; reuse distance p50/p90/p99 {:.3}/{:.3}/{:.3} of the distinct blocks; shared prefix {:.1} blocks mean, {:.0} p90 ({:.3} of a request)\n",
        s.requests,
        s.references,
        s.distinct,
        s.reuse_fraction,
        s.reuse_distance[0],
        s.reuse_distance[1],
        s.reuse_distance[2],
        s.shared_prefix[0],
        s.shared_prefix[1],
        s.shared_fraction
    )
}

/// Writes the trace; prints its statistics.
pub fn generate_trace(a: &TraceGenArgs, out: &Output) -> Result<(), Failure> {
    let mut p = Params::new(a.shape, a.seed, a.requests);
    p.users = a.users.unwrap_or(p.users);
    p.shared_blocks = a.shared_blocks.unwrap_or(p.shared_blocks);
    p.message_blocks = a.message_blocks.unwrap_or(p.message_blocks);
    p.answer_blocks = a.answer_blocks.unwrap_or(p.answer_blocks);
    p.prompts = a.prompts.unwrap_or(p.prompts);
    p.turns = a.turns.unwrap_or(p.turns);
    p.think_ms = a.think_ms.unwrap_or(p.think_ms);
    let trace = generate(&p);
    let io = |e: std::io::Error| Failure::refused(format!("{}: {e}", a.out.display()));
    let mut w = std::io::BufWriter::new(std::fs::File::create(&a.out).map_err(io)?);
    for r in &trace {
        let row = json!({
            "timestamp": r.timestamp,
            "input_length": r.input_length,
            "output_length": r.output_length,
            "hash_ids": r.hash_ids,
        });
        writeln!(w, "{row}").map_err(io)?;
    }
    w.flush().map_err(io)?;
    let ids: Vec<Vec<u64>> = trace.into_iter().map(|r| r.hash_ids).collect();
    let s = stats(&ids);
    let name = a.out.display().to_string();
    out.emit(&line(&name, &s), || doc(&name, &s))
}

/// Prints each trace's statistics.
pub fn print_stats(a: &TraceStatsArgs, out: &Output) -> Result<(), Failure> {
    for path in &a.traces {
        let ids: Vec<Vec<u64>> = crate::trace::load(path, None)?
            .into_iter()
            .map(|r| r.hash_ids)
            .collect();
        let s = stats(&ids);
        let name = path.display().to_string();
        out.emit(&line(&name, &s), || doc(&name, &s))?;
    }
    Ok(())
}
