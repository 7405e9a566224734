//! kill -9 of a simulated engine while it loads: the daemon reclaims its leases and pins and
//! detaches its pools (no copy into its pages after that), and keeps serving another engine
//! byte-exact.

mod common;

use std::process::Stdio;
use std::time::Duration;

use common::daemon::{Serve, bin, metric, wait};

/// Big pages (128 KiB: 4 layers of 16 tokens × 8 heads × 64 elements × K and V) so a Load takes
/// a while.
const BIG: [&str; 8] = [
    "--layers",
    "4",
    "--kv-heads",
    "8",
    "--head-size",
    "64",
    "--seed",
    "11",
];

#[test]
fn a_killed_engine_loses_its_leases_and_pins_and_others_carry_on() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let serve = Serve::start(&dir.path().join("data"));
    let (code, first) = serve.engine_sim(&[&BIG[..], &["--requests", "12"]].concat());
    assert_eq!(code, Some(0), "{first}");
    // A consumer loading the same requests over and over, killed while it holds a lease.
    let mut victim = bin()
        .args(["engine-sim", "--json", "--consumer", "--instance", "victim"])
        .arg("--socket")
        .arg(&serve.socket)
        .args(BIG)
        .args(["--requests", "1000000"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("{e}"));
    serve.wait_for("the victim holding a lease", |t| {
        metric(t, "orbitkv_leases") > 0 && metric(t, "orbitkv_loaded_pages_total") > 0
    });
    victim.kill().unwrap_or_else(|e| panic!("{e}"));
    let status = wait(&mut victim, Duration::from_secs(10));
    assert!(!status.success());
    serve.wait_for("the victim's leases, pins and sessions reclaimed", |t| {
        metric(t, "orbitkv_leases") == 0
            && metric(t, "orbitkv_store_pins") == 0
            && metric(t, "orbitkv_sessions") == 0
    });
    // Another engine is served as before, every byte checked.
    let (code, after) = serve.engine_sim(&[&BIG[..], &["--requests", "12", "--consumer"]].concat());
    assert_eq!(code, Some(0), "{after}");
    assert_eq!(after["wrong_bytes"], 0, "{after}");
    assert_eq!(after["proven_tokens"], after["requested_tokens"], "{after}");
    let (status, stderr) = serve.stop();
    assert!(status.success(), "{stderr}");
}
