//! Recovery contracts end to end, with real processes: a sliding-window + recurrent-state
//! instance is restored only at boundaries its contract proves (a checkpoint there, the window
//! before it), and a two-rank instance only where both ranks' records exist.

mod common;

use common::daemon::Serve;

fn u(v: &serde_json::Value, k: &str) -> u64 {
    v[k].as_u64().unwrap_or_else(|| panic!("no {k} in {v}"))
}

fn clean(code: Option<i32>, r: &serde_json::Value) {
    assert_eq!(code, Some(0), "{r}");
    assert_eq!(
        (u(r, "errors"), u(r, "wrong_bytes"), u(r, "unproven")),
        (0, 0, 0),
        "{r}"
    );
}

#[test]
fn a_hybrid_instance_is_restored_only_at_proven_boundaries() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let serve = Serve::start(&dir.path().join("data"));
    let args = ["--contract", "hybrid", "--seed", "3", "--requests", "48"];
    let (code, first) = serve.engine_sim(&[&args[..], &["--instance", "hybrid-a"]].concat());
    clean(code, &first);
    let (code, second) =
        serve.engine_sim(&[&args[..], &["--instance", "hybrid-b", "--consumer"]].concat());
    clean(code, &second);
    // engine-sim checks each proof against the contract (`unproven` is 0 above); some requests
    // find window pages but no checkpoint and recompute.
    assert!(u(&second, "hits") > 0, "{second}");
    assert!(
        second["misses"]["no_checkpoint"]
            .as_u64()
            .is_some_and(|n| n > 0),
        "{second}"
    );
    assert!(u(&second, "proven_tokens") < u(&second, "requested_tokens"));
    // A dense instance of the same model never reads them: another layout, another namespace.
    let (code, dense) = serve.engine_sim(&["--seed", "3", "--requests", "48", "--consumer"]);
    clean(code, &dense);
    assert_eq!(u(&dense, "hits"), 0, "{dense}");
}

#[test]
fn a_two_rank_instance_hits_only_when_both_ranks_records_exist() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let serve = Serve::start(&dir.path().join("data"));
    let args = ["--ranks", "2", "--seed", "9", "--requests", "16"];
    // Rank 1 of the first instance never publishes.
    let (code, first) =
        serve.engine_sim(&[&args[..], &["--instance", "tp-a", "--silent-rank", "1"]].concat());
    clean(code, &first);
    let (code, half) =
        serve.engine_sim(&[&args[..], &["--instance", "tp-b", "--consumer"]].concat());
    clean(code, &half);
    assert_eq!(u(&half, "hits"), 0, "{half}");
    assert!(
        half["misses"]["missing_rank"]
            .as_u64()
            .is_some_and(|n| n > 0),
        "{half}"
    );
    // Once both ranks have published, everything is served.
    let (code, full) = serve.engine_sim(&[&args[..], &["--instance", "tp-c"]].concat());
    clean(code, &full);
    let (code, after) =
        serve.engine_sim(&[&args[..], &["--instance", "tp-d", "--consumer"]].concat());
    clean(code, &after);
    assert!(u(&after, "hits") > 0, "{after}");
    assert_eq!(
        u(&after, "proven_tokens"),
        u(&after, "requested_tokens"),
        "{after}"
    );
}
