//! `orbitkv bench write|verify`: deterministic self-test and burn-in. `write` stores N bundles
//! whose bytes are a function of (seed, index, size) and reports each durable batch on stdout;
//! `verify`, in another process, checks every bundle is returned byte-exact or missing — never
//! different bytes. `replay` (in [`crate::cmd::replay`]) replays a request trace.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use clap::{Args, Subcommand, ValueEnum};
use orbitkv_segments::{Alignment, RecordMeta};
use orbitkv_state::{FormatDigest, Namespace, StateKey, TokenRange};
use orbitkv_store::{Durability, StateStore, StoreConfig};
use orbitkv_wal::NamespaceInfo;
use serde_json::json;
use sha2::{Digest, Sha256};

use super::bench_records::{EXIT_MISMATCH, bench_namespace_info, bench_state_key};
use crate::Failure;
use crate::output::Output;
use crate::size::parse_size;

/// Bundles per durable batch.
const BATCH: u64 = 8;

/// `bench` subcommands.
#[derive(Subcommand)]
pub enum BenchCommand {
    /// Write N deterministic bundles, printing `synced <n>` after each durable batch.
    Write(WriteArgs),
    /// Check N deterministic bundles: found byte-exact, missing, or mismatched.
    Verify(VerifyArgs),
    /// Replay a Mooncake-format request trace against a capacity-bounded store.
    Replay(crate::cmd::replay::ReplayArgs),
    /// Write a synthetic Mooncake-format trace of one workload shape, seeded.
    TraceGen(crate::cmd::tracegen::TraceGenArgs),
    /// Print how traces reuse their blocks (reuses, reuse distance, shared prefixes).
    TraceStats(crate::cmd::tracegen::TraceStatsArgs),
    /// Every reclaim policy on every workload shape and capacity, against LRU and MIN.
    Matrix(crate::cmd::matrix::MatrixArgs),
}

/// When `bench write` syncs.
#[derive(Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum SyncMode {
    /// After every batch of 8 bundles (group commit).
    Batch,
    /// Never.
    None,
}

/// `bench write`.
#[derive(Args)]
pub struct WriteArgs {
    /// The data directory.
    #[arg(long, value_name = "DIR", default_value = "./orbitkv-data")]
    data_dir: PathBuf,
    /// Bundles to write.
    #[arg(long, value_name = "N")]
    count: u64,
    /// Seed of the keys and bytes.
    #[arg(long, value_name = "S")]
    seed: u64,
    /// Payload bytes per bundle (units allowed).
    #[arg(long, value_name = "BYTES", default_value = "64KiB", value_parser = parse_size)]
    size: u64,
    /// Namespaces the bundles are spread over.
    #[arg(long, value_name = "K", default_value_t = 1)]
    namespaces: u64,
    /// Sync policy.
    #[arg(long, value_enum, default_value_t = SyncMode::Batch)]
    sync: SyncMode,
}

/// `bench verify`.
#[derive(Args)]
pub struct VerifyArgs {
    /// The data directory.
    #[arg(long, value_name = "DIR", default_value = "./orbitkv-data")]
    data_dir: PathBuf,
    /// Bundles to check (the first N).
    #[arg(long, value_name = "N")]
    count: u64,
    /// Seed the bundles were written with.
    #[arg(long, value_name = "S")]
    seed: u64,
    /// Namespaces they were spread over.
    #[arg(long, value_name = "K", default_value_t = 1)]
    namespaces: u64,
}

fn digest(parts: &[&[u8]]) -> [u8; 32] {
    let mut h = Sha256::new();
    for p in parts {
        h.update((p.len() as u64).to_le_bytes());
        h.update(p);
    }
    h.finalize().into()
}

/// The namespace of bench namespace `k` under `seed`.
pub fn bench_namespace(seed: u64, k: u64) -> Namespace {
    Namespace(digest(&[
        b"orbitkv-bench-namespace",
        &seed.to_le_bytes(),
        &k.to_le_bytes(),
    ]))
}

fn bench_key(seed: u64, namespaces: u64, i: u64) -> Result<StateKey, Failure> {
    let native = digest(&[b"orbitkv-bench-key", &seed.to_le_bytes(), &i.to_le_bytes()]);
    bench_state_key(bench_namespace(seed, i % namespaces.max(1)), &native)
}

/// Bundle `i`'s bytes: a function of (seed, index, length), so a truncated record never matches.
pub fn bench_payload(seed: u64, i: u64, len: usize) -> Vec<u8> {
    let d = digest(&[
        b"orbitkv-bench-bytes",
        &seed.to_le_bytes(),
        &i.to_le_bytes(),
        &(len as u64).to_le_bytes(),
    ]);
    orbitkv_testkit::payload(
        u64::from_le_bytes([d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7]]),
        len,
    )
}

/// Opens the store on the default backend: O_DIRECT (with 4 KiB-aligned segments) where the
/// file system takes it, else buffered.
fn open(data_dir: &Path, durability: Durability) -> Result<StateStore, Failure> {
    let mut cfg = StoreConfig::new(data_dir);
    cfg.durability = durability;
    let (io, direct) = orbitkv_store::io::default_for(data_dir);
    if direct {
        cfg.alignment = Alignment::Direct;
    }
    StateStore::open(io, cfg).map_err(|e| Failure::refused(e.to_string()))
}

fn info(seed: u64) -> NamespaceInfo {
    bench_namespace_info("orbitkv-bench", format!("seed-{seed}"))
}

/// Runs a bench command.
pub fn run(cmd: &BenchCommand, out: &Output) -> Result<(), Failure> {
    match cmd {
        BenchCommand::Write(a) => write(a, out),
        BenchCommand::Verify(a) => verify(a, out),
        BenchCommand::Replay(a) => crate::cmd::replay::run(a, out),
        BenchCommand::TraceGen(a) => crate::cmd::tracegen::generate_trace(a, out),
        BenchCommand::TraceStats(a) => crate::cmd::tracegen::print_stats(a, out),
        BenchCommand::Matrix(a) => crate::cmd::matrix::run(a, out),
    }
}

fn write(a: &WriteArgs, out: &Output) -> Result<(), Failure> {
    let size = usize::try_from(a.size)
        .ok()
        .filter(|&s| s <= orbitkv_segments::MAX_PAYLOAD_LEN)
        .ok_or_else(|| {
            Failure::refused(format!(
                "--size: at most {} bytes",
                orbitkv_segments::MAX_PAYLOAD_LEN
            ))
        })?;
    if a.namespaces == 0 {
        return Err(Failure::refused("--namespaces must be at least 1"));
    }
    let store = open(&a.data_dir, Durability::Manual)?;
    for k in 0..a.namespaces {
        store
            .register_namespace(bench_namespace(a.seed, k), info(a.seed))
            .map_err(|e| Failure::refused(e.to_string()))?;
    }
    let start = Instant::now();
    let mut synced = 0;
    let mut stdout = std::io::stdout();
    let mut report_synced = |n: u64| -> Result<(), Failure> {
        writeln!(stdout, "synced {n}")
            .and_then(|()| stdout.flush())
            .map_err(|e| Failure::internal(format!("stdout: {e}")))
    };
    for i in 0..a.count {
        let key = bench_key(a.seed, a.namespaces, i)?;
        let meta = RecordMeta {
            key,
            parent: None,
            range: TokenRange::new(i * 16, i * 16 + 16)
                .map_err(|e| Failure::internal(e.to_string()))?,
            format: FormatDigest([0xbe; 32]),
        };
        let p = bench_payload(a.seed, i, size);
        store
            .put(&[(meta, p.as_slice())])
            .map_err(|e| Failure::refused(format!("bundle {i}: {e}")))?;
        if a.sync == SyncMode::Batch && (i + 1) % BATCH == 0 {
            store
                .sync()
                .map_err(|e| Failure::refused(format!("sync: {e}")))?;
            synced = i + 1;
            report_synced(synced)?;
        }
    }
    if a.sync == SyncMode::Batch {
        store
            .close()
            .map_err(|e| Failure::refused(format!("close: {e}")))?;
        if synced != a.count {
            synced = a.count;
            report_synced(synced)?;
        }
    }
    let secs = start.elapsed().as_secs_f64();
    if out.json() {
        println!(
            "{}",
            json!({
                "written": a.count,
                "synced": synced,
                "bytes": a.count * a.size,
                "seconds": secs,
            })
        );
    }
    Ok(())
}

fn verify(a: &VerifyArgs, out: &Output) -> Result<(), Failure> {
    let store = open(&a.data_dir, Durability::Manual)?;
    let (mut found, mut missing, mut mismatched) = (0u64, 0u64, 0u64);
    let mut buf = Vec::new();
    for i in 0..a.count {
        let key = bench_key(a.seed, a.namespaces.max(1), i)?;
        match store.get(&key, &mut buf) {
            Ok(Some(_)) => {
                if buf == bench_payload(a.seed, i, buf.len()) {
                    found += 1;
                } else {
                    mismatched += 1;
                }
            }
            Ok(None) => missing += 1,
            Err(e) => return Err(Failure::refused(format!("bundle {i}: {e}"))),
        }
    }
    let text = format!(
        "found {found}, missing {missing}, mismatched {mismatched} of {}\n",
        a.count
    );
    if out.json() {
        // Exactly this document, keys in this order (scripts compare it).
        println!(r#"{{"found":{found},"missing":{missing},"mismatched":{mismatched}}}"#);
    } else {
        out.emit(&text, || json!({}))?;
    }
    if mismatched > 0 {
        return Err(Failure::with_code(
            EXIT_MISMATCH,
            format!("{mismatched} bundles came back with different bytes"),
        ));
    }
    Ok(())
}
