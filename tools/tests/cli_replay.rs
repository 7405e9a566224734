//! `orbitkv bench replay` on a prefix of the shared trace: the JSON an operator scripts, hits that
//! are read back byte-exact, a budget the store keeps, and `--compare` ranking policies against
//! the simulated LRU and MIN references.

use std::path::Path;
use std::process::{Command, Output};

const TRACE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/testdata/traces/mooncake_synthetic_trace.jsonl"
);

fn replay(args: &[&str], dir: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_orbitkv"))
        .args(["bench", "replay", "--trace", TRACE, "--json"])
        .args(args)
        .arg("--data-dir")
        .arg(dir)
        .env_remove("ORBITKV_LOG")
        .output()
        .unwrap_or_else(|e| panic!("run orbitkv: {e}"))
}

fn json(o: &Output) -> serde_json::Value {
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&o.stdout)))
}

fn num(v: &serde_json::Value, k: &str) -> f64 {
    v[k].as_f64()
        .unwrap_or_else(|| panic!("{k} missing in {v}"))
}

#[test]
fn a_store_policy_replays_with_verified_hits_and_the_documented_json() {
    let root = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let dir = root.path().join("replay");
    let o = replay(
        &[
            "--requests",
            "600",
            "--block-bytes",
            "1KiB",
            "--ssd-bytes",
            "2MiB",
            "--dram-bytes",
            "256KiB",
        ],
        &dir,
    );
    let v = json(&o);
    for k in [
        "requests",
        "block_refs",
        "hits",
        "hit_ratio",
        "bytes_written",
        "bytes_read",
        "seconds",
    ] {
        assert!(v.get(k).is_some(), "{k} missing in {v}");
    }
    assert_eq!(v["requests"], 600);
    assert_eq!(v["policy"], "record-lru");
    assert_eq!(v["mismatched"], 0);
    let hits = num(&v, "hits");
    let refs = num(&v, "block_refs");
    assert!(hits > 0.0 && hits < refs, "{v}");
    assert!((num(&v, "hit_ratio") - hits / refs).abs() < 1e-9);
    // Every hit was read back, a KiB each; the budget forced evictions.
    assert_eq!(num(&v, "bytes_read"), hits * 1024.0);
    assert!(num(&v, "evicted") > 0.0, "{v}");
    // The store it leaves stays within its budget and is clean. A file takes its length, less
    // the holes punched in it.
    let bytes: u64 = std::fs::read_dir(dir.join("segments"))
        .unwrap_or_else(|e| panic!("{e}"))
        .map(|e| {
            use std::os::unix::fs::MetadataExt;
            e.and_then(|e| e.metadata())
                .map(|m| m.len().min(m.blocks() * 512))
                .unwrap_or_else(|e| panic!("{e}"))
        })
        .sum();
    assert!(bytes <= 2 << 20, "{bytes} bytes of segments");
    let fsck = Command::new(env!("CARGO_BIN_EXE_orbitkv"))
        .args(["fsck", "--data-dir"])
        .arg(&dir)
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(fsck.status.code(), Some(0));
    // A second replay into the same directory is refused rather than mixed in.
    let again = replay(
        &[
            "--requests",
            "1",
            "--ssd-bytes",
            "2MiB",
            "--dram-bytes",
            "0",
        ],
        &dir,
    );
    assert_eq!(again.status.code(), Some(2));
}

#[test]
fn compare_ranks_every_policy_between_the_references() {
    let root = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let dir = root.path().join("cmp");
    let o = replay(
        &[
            "--compare",
            "--requests",
            "800",
            "--block-bytes",
            "1KiB",
            "--ssd-bytes",
            "3MiB",
            "--dram-bytes",
            "0",
        ],
        &dir,
    );
    let v = json(&o);
    let rows = v["results"]
        .as_array()
        .unwrap_or_else(|| panic!("no results in {v}"));
    let ratio = |name: &str| {
        rows.iter()
            .find(|r| r["policy"] == name)
            .map(|r| num(r, "hit_ratio"))
            .unwrap_or_else(|| panic!("{name} missing in {v}"))
    };
    let (lru, min) = (ratio("lru"), ratio("min"));
    assert!(min > lru, "{v}");
    for p in ["record-lru", "s3-fifo", "fifo", "fifo-reinsert"] {
        let r = ratio(p);
        assert!(r > 0.0 && r <= min + 1e-9, "{p}: {r} above MIN {min}");
    }
    for r in rows {
        assert_eq!(r["mismatched"], 0, "{r}");
    }
    // The per-policy directories are gone.
    let left = std::fs::read_dir(&dir).map(|d| d.count()).unwrap_or(0);
    assert_eq!(left, 0);
}
