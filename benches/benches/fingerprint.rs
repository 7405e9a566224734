//! Artifact fingerprinting throughput on a generated 1 GiB model directory, against raw SHA-256 of
//! an in-memory buffer on the same number of threads, in the same run (target ratio >= 0.8).
//!
//! The directory is hashed once untimed first, so both sides read from memory (page cache versus
//! heap): the ratio is the fingerprinter's own overhead (reads, chunk tree, scheduling).

use orbitkv_testkit::Xorshift;
use std::hint::black_box;
use std::path::Path;
use std::time::Instant;

use criterion::{Criterion, Throughput};
use orbitkv_adapters::identity::fingerprint::{FingerprintOptions, fingerprint_dir};
use orbitkv_benches::{Target, record, report};
use sha2::{Digest, Sha256};

const GIB: usize = 1 << 30;

/// Writes a model-like directory: a few large shards and small metadata files, `total` bytes.
fn generate(dir: &Path, total: usize) -> std::io::Result<()> {
    let shards = [total / 2, total / 4, total / 8, total / 8 - 64 * 1024];
    let mut stream = Xorshift::new(0x9e37_79b9_7f4a_7c15u64);
    for (i, size) in shards.iter().enumerate() {
        let mut data = vec![0u8; *size];
        stream.fill(&mut data);
        std::fs::write(
            dir.join(format!("model-{i:05}-of-00004.safetensors")),
            &data,
        )?;
    }
    std::fs::write(dir.join("config.json"), br#"{"model_type":"llama"}"#)?;
    std::fs::write(dir.join("tokenizer.json"), vec![b'x'; 64 * 1024 - 32])?;
    Ok(())
}

fn sha_parallel(buf: &[u8], threads: usize) -> [u8; 32] {
    let part = buf.len().div_ceil(threads);
    let digests: Vec<[u8; 32]> = std::thread::scope(|s| {
        let hs: Vec<_> = buf
            .chunks(part)
            .map(|c| s.spawn(move || -> [u8; 32] { Sha256::digest(c).into() }))
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap_or([0; 32]))
            .collect()
    });
    digests[0]
}

fn main() {
    let threads = std::thread::available_parallelism().map_or(1, usize::from);
    let Ok(dir) = tempfile::tempdir() else {
        eprintln!("cannot create a temporary directory");
        return;
    };
    if let Err(e) = generate(dir.path(), GIB) {
        eprintln!("generating the model directory failed: {e}");
        return;
    }
    let opts = FingerprintOptions {
        threads,
        progress: None,
    };
    // Warm the page cache.
    if let Err(e) = fingerprint_dir(dir.path(), &opts) {
        eprintln!("fingerprint failed: {e}");
        return;
    }
    let buf = vec![0x5au8; GIB];

    let mut c = Criterion::default().sample_size(10).configure_from_args();
    let mut g = c.benchmark_group("fingerprint_1gib");
    g.throughput(Throughput::Bytes(GIB as u64));
    g.bench_function(format!("fingerprint_dir/{threads}_threads"), |b| {
        b.iter_custom(|iters| {
            let t = Instant::now();
            for _ in 0..iters {
                black_box(fingerprint_dir(dir.path(), &opts).map(|f| f.digest).ok());
            }
            record("fingerprint", iters, t.elapsed())
        })
    });
    g.bench_function(format!("sha256_in_memory/{threads}_threads"), |b| {
        b.iter_custom(|iters| {
            let t = Instant::now();
            for _ in 0..iters {
                black_box(sha_parallel(&buf, threads));
            }
            record("sha256", iters, t.elapsed())
        })
    });
    g.finish();
    c.final_summary();
    report(
        &format!("fingerprint throughput / in-memory SHA-256 throughput ({threads} threads)"),
        "fingerprint",
        "sha256",
        false,
        Target::AtLeast(0.8),
    );
}
