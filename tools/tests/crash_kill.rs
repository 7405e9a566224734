//! Crash tests with a real process: `orbitkv bench write` is killed with SIGKILL after its k-th
//! `synced` line or after a seeded delay, 32 times over fixed seeds and three data directories
//! (so recovery also runs over stores that crashed before). After each kill `orbitkv bench verify`
//! must find every bundle reported synced byte-exact, and no bundle with different bytes.

#![expect(
    clippy::expect_used,
    reason = "test code: a failed expect is a failed test"
)]

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const COUNT: u64 = 240;

fn orbitkv() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_orbitkv"));
    c.env_remove("ORBITKV_LOG");
    c
}

/// Runs `bench write` for `seed` and kills it; returns how many bundles it reported synced.
fn write_and_kill(dir: &Path, seed: u64) -> u64 {
    let mut child = orbitkv()
        .args([
            "bench",
            "write",
            "--count",
            &COUNT.to_string(),
            "--seed",
            &seed.to_string(),
        ])
        .args(["--size", "12KiB", "--data-dir"])
        .arg(dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn bench write");
    let stdout = child.stdout.take().expect("stdout");
    let after_lines = 1 + seed % 12;
    let by_delay = seed % 2 == 1;
    let delay = Duration::from_millis(5 + (seed * 37) % 120);
    let start = Instant::now();
    let mut synced = 0;
    let mut lines = BufReader::new(stdout).lines();
    loop {
        if by_delay && start.elapsed() >= delay {
            break;
        }
        match lines.next() {
            Some(Ok(line)) => {
                if let Some(n) = line.strip_prefix("synced ") {
                    synced = n.trim().parse().expect("synced count");
                    if !by_delay && synced / 8 >= after_lines {
                        break;
                    }
                }
            }
            _ => break, // finished before the kill point
        }
    }
    let _ = child.kill(); // SIGKILL
    let _ = child.wait();
    synced
}

fn verify(dir: &Path, seed: u64, count: u64) -> (u64, u64, u64) {
    let out = orbitkv()
        .args([
            "bench",
            "verify",
            "--json",
            "--count",
            &count.to_string(),
            "--seed",
            &seed.to_string(),
            "--data-dir",
        ])
        .arg(dir)
        .output()
        .expect("run bench verify");
    let text = String::from_utf8_lossy(&out.stdout);
    let v: serde_json::Value = serde_json::from_str(text.trim()).unwrap_or_else(|e| {
        panic!(
            "verify printed {text:?} ({e}); stderr {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    let n = |k: &str| v[k].as_u64().expect("count");
    (n("found"), n("missing"), n("mismatched"))
}

#[test]
fn sigkill_never_loses_a_synced_bundle_or_returns_wrong_bytes() {
    let root = tempfile::tempdir().expect("tempdir");
    let mut history: Vec<(u64, u64, u64)> = Vec::new(); // (dir, seed, synced)
    for seed in 0..32u64 {
        let d = seed % 3;
        let dir = root.path().join(format!("store-{d}"));
        let synced = write_and_kill(&dir, seed);
        history.push((d, seed, synced));
        // Everything reported synced, in this and earlier runs on this directory, is exact.
        for &(hd, hs, hn) in history.iter().filter(|(hd, _, _)| *hd == d) {
            let _ = hd;
            let (found, missing, mismatched) = verify(&dir, hs, hn);
            assert_eq!(
                (missing, mismatched),
                (0, 0),
                "seed {hs}: {found} found of {hn} synced"
            );
        }
        let (_, _, mismatched) = verify(&dir, seed, COUNT);
        assert_eq!(mismatched, 0, "seed {seed}: different bytes returned");
        // fsck repairs whatever the kill left (0 clean or 1 repaired), then checks clean.
        let fsck = |args: &[&str]| {
            orbitkv()
                .arg("fsck")
                .args(args)
                .arg("--data-dir")
                .arg(&dir)
                .output()
                .expect("run fsck")
                .status
                .code()
        };
        let repaired = fsck(&["--repair"]);
        assert!(
            matches!(repaired, Some(0 | 1)),
            "seed {seed}: fsck --repair exited {repaired:?}"
        );
        assert_eq!(fsck(&[]), Some(0), "seed {seed}: not clean after repair");
    }
    assert!(history.iter().any(|h| h.2 > 0) && history.iter().any(|h| h.2 < COUNT));
}
