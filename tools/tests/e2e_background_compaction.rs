//! `orbitkv serve`'s background compaction: once a namespace is retired, its dead segments are
//! rewritten away within a few intervals (logged at info), and the other namespace is still
//! served byte for byte; with `--compact-interval off` nothing is compacted.

mod common;

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use common::daemon::{Serve, bin};
use orbitkv_protocol::client::Client;
use orbitkv_sim::workload::synthetic;
use orbitkv_sim::{EngineOptions, SimEngine, SimInstance};

/// An instance with 128 KiB pages, in its own namespace (`scope`).
fn instance(name: &str, scope: &str) -> SimInstance {
    let mut i = SimInstance::new(name, 1);
    i.layers = 4;
    i.kv_heads = 8;
    i.head_size = 64;
    i.scope = scope.to_owned();
    i
}

fn serve(data: &Path, interval: &str) -> Serve {
    let child = bin()
        .env_remove("ORBITKV_LOG")
        .args(["serve", "--json", "--log-level", "info", "--data-dir"])
        .arg(data)
        .args(["--dram-bytes", "0", "--ssd-bytes", "1GiB"])
        .args(["--segment-bytes", "1MiB", "--compact-interval", interval])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn: {e}"));
    Serve::attach(child)
}

/// Publishes `requests` with an engine of `inst`; returns the namespace and the proven tokens.
fn run(serve: &Serve, inst: SimInstance, requests: &[Vec<u64>]) -> ([u8; 32], u64) {
    let mut e = SimEngine::start(EngineOptions::new(serve.socket.clone(), inst))
        .unwrap_or_else(|e| panic!("{e}"));
    for r in requests {
        e.run(r).unwrap_or_else(|e| panic!("{e}"));
    }
    assert_eq!(e.report().pages.wrong_bytes, 0);
    (e.namespace(), e.report().proven_tokens)
}

/// Sealed segments with a live fraction below one half, after the daemon stopped.
fn dead_segments(data: &Path) -> usize {
    let out = bin()
        .args(["inspect", "--json", "--data-dir"])
        .arg(data)
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    let doc = common::daemon::report(&out);
    doc["segments"]
        .as_array()
        .unwrap_or_else(|| panic!("{doc}"))
        .iter()
        .filter(|s| s["live_fraction"].as_f64().is_some_and(|f| f < 0.5))
        .count()
}

/// Publishes in two namespaces, retires one, waits `wait`; returns the daemon's log.
fn retire_and_wait(data: &Path, interval: &str, wait: Duration) -> String {
    let serve = serve(data, interval);
    let requests = synthetic(11, 24, 16);
    run(&serve, instance("kept", "kept"), &requests[..8]);
    let (ns, _) = run(&serve, instance("gone", "gone"), &requests[8..]);
    let mut c = Client::connect(&serve.socket).unwrap_or_else(|e| panic!("{e}"));
    c.hello("test").unwrap_or_else(|e| panic!("{e}"));
    c.retire(ns).unwrap_or_else(|e| panic!("{e}"));
    std::thread::sleep(wait);
    let (status, stderr) = serve.stop();
    assert!(status.success(), "{stderr}");
    stderr
}

#[test]
fn a_retired_namespace_is_compacted_away_in_the_background() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let data = dir.path().join("data");
    let log = retire_and_wait(&data, "200ms", Duration::from_millis(1500));
    assert!(log.contains("background compaction"), "{log}");
    // Only the segment still active at the Retire, sealed when the store closed, may be left.
    assert!(dead_segments(&data) <= 1, "{log}");
    // The namespace that was not retired is served whole, byte for byte.
    let serve = serve(&data, "200ms");
    let requests = synthetic(11, 24, 16);
    let mut consumer = EngineOptions::new(serve.socket.clone(), instance("kept-2", "kept"));
    consumer.publish = false;
    let mut e = SimEngine::start(consumer).unwrap_or_else(|e| panic!("{e}"));
    for r in &requests[..8] {
        e.run(r).unwrap_or_else(|e| panic!("{e}"));
    }
    let r = e.report().clone();
    drop(e);
    assert_eq!(r.pages.wrong_bytes, 0);
    assert_eq!(r.proven_tokens, r.requested_tokens, "{r:?}");
    let (status, stderr) = serve.stop();
    assert!(status.success(), "{stderr}");
}

#[test]
fn compaction_off_leaves_dead_segments_alone() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let data = dir.path().join("data");
    let log = retire_and_wait(&data, "off", Duration::from_millis(600));
    assert!(!log.contains("background compaction"), "{log}");
    assert!(dead_segments(&data) > 1);
}
