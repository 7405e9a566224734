//! `orbitkv loadgen` with 8 concurrent simulated engines replaying the published trace against a
//! real daemon, bounded in time: zero errors, zero wrong bytes, and `--json` prints exactly the
//! documented object. A second pass over the same requests finds what the first published.

mod common;

use common::daemon::{Serve, bin, trace};

fn loadgen(serve: &Serve, requests: &str) -> serde_json::Value {
    let out = bin()
        .args(["loadgen", "--json", "--clients", "8", "--duration", "60"])
        .args(["--requests", requests, "--trace"])
        .arg(trace())
        .arg("--socket")
        .arg(&serve.socket)
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    let doc = common::daemon::report(&out);
    assert!(
        out.status.success(),
        "{doc}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut keys: Vec<&str> = doc
        .as_object()
        .unwrap_or_else(|| panic!("not an object: {doc}"))
        .keys()
        .map(String::as_str)
        .collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        [
            "errors",
            "hits",
            "p50_us",
            "p99_us",
            "requests",
            "wrong_bytes"
        ]
    );
    assert_eq!(doc["errors"], 0, "{doc}");
    assert_eq!(doc["wrong_bytes"], 0, "{doc}");
    doc
}

#[test]
fn eight_clients_replay_the_trace_without_errors_or_wrong_bytes() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let serve = Serve::start(&dir.path().join("data"));
    let first = loadgen(&serve, "160");
    assert!(first["requests"].as_u64().is_some_and(|n| n > 0), "{first}");
    let second = loadgen(&serve, "160");
    // Everything the first pass computed was published (the SSD tier holds it all): each
    // request of the second pass with a full 16-token block is a hit.
    let text = std::fs::read_to_string(trace()).unwrap_or_else(|e| panic!("{e}"));
    let with_blocks = text
        .lines()
        .take(160)
        .filter(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}"));
            v["input_length"].as_u64().is_some_and(|n| n >= 16)
        })
        .count();
    assert!(with_blocks > 150);
    assert_eq!(second["hits"], with_blocks, "{second}");
    let (status, stderr) = serve.stop();
    assert!(status.success(), "{stderr}");
}
