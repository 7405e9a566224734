//! kill -9 of the daemon while engines publish: after a restart on the same data directory
//! nothing is served wrong — every byte a later engine loads is checked against what the
//! computation produces, and every proof against the contract — and what was durable before the
//! kill is still served.

mod common;

use std::process::Stdio;
use std::time::Duration;

use common::daemon::{Serve, bin, metric, wait};

/// Big pages (128 KiB), so a Publish takes a while.
const BIG: [&str; 6] = ["--layers", "4", "--kv-heads", "8", "--head-size", "64"];

#[test]
fn a_daemon_killed_mid_publish_serves_nothing_wrong_after_restart() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let data = dir.path().join("data");
    let mut serve = Serve::start(&data);
    // Durable before the kill: a first batch published and acknowledged.
    let (code, first) =
        serve.engine_sim(&[&BIG[..], &["--seed", "13", "--requests", "8"]].concat());
    assert_eq!(code, Some(0), "{first}");
    // Engines publishing new requests (another seed) when the daemon dies.
    let mut engines: Vec<_> = (0..2)
        .map(|i| {
            bin()
                .args(["engine-sim", "--json", "--instance", &format!("pub-{i}")])
                .arg("--socket")
                .arg(&serve.socket)
                .args(BIG)
                .args(["--seed", &format!("{}", 100 + i), "--requests", "100000"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap_or_else(|e| panic!("{e}"))
        })
        .collect();
    let before = serve.metric("orbitkv_published_pages_total");
    serve.wait_for("publishes in flight", |t| {
        metric(t, "orbitkv_published_pages_total") > before + 200
    });
    serve.child.kill().unwrap_or_else(|e| panic!("{e}"));
    let status = wait(&mut serve.child, Duration::from_secs(10));
    assert!(!status.success());
    for e in &mut engines {
        // Each engine sees its connection fail and stops.
        let s = wait(e, Duration::from_secs(20));
        assert!(!s.success());
    }
    drop(serve);
    // Restart on the same directory (the dead daemon's socket file is replaced).
    let serve = Serve::start(&data);
    for seed in ["13", "100", "101"] {
        let mut args = BIG.to_vec();
        args.extend(["--seed", seed, "--requests", "8", "--consumer"]);
        let (code, r) = serve.engine_sim(&args);
        assert_eq!(code, Some(0), "seed {seed}: {r}");
        assert_eq!(r["wrong_bytes"], 0, "seed {seed}: {r}");
        assert_eq!(r["unproven"], 0, "seed {seed}: {r}");
        if seed == "13" {
            // Acknowledged as durable before the kill: all of it is served.
            assert_eq!(r["proven_tokens"], r["requested_tokens"], "{r}");
        }
    }
    let (status, stderr) = serve.stop();
    assert!(status.success(), "{stderr}");
}
