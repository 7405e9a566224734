//! The simulated engine against an in-process daemon: a second instance of the same computation
//! hits what the first published, every loaded byte is what the computation produces, every
//! proof is what the contract demands; a hybrid (sliding window + recurrent state) instance is
//! restored only at checkpoints; a rank that never publishes means no hit for its instance; an
//! engine without a scheduler process (as SGLang) seals with its workers alone and hits too.

mod common;

use common::Daemon;
use orbitkv_sim::workload::synthetic;
use orbitkv_sim::{EngineOptions, Report, SimContract, SimEngine, SimInstance};

/// Runs `requests` through a new engine of `inst`; `silent` ranks never publish, and an
/// instance named `*-consumer` publishes nothing.
fn run(d: &Daemon, inst: SimInstance, requests: &[Vec<u64>], silent: &[u32]) -> Report {
    let mut opts = EngineOptions::new(d.socket.clone(), inst);
    opts.pool_pages = 64;
    opts.publish = !opts.instance.name.ends_with("-consumer");
    opts.silent_ranks = silent.to_vec();
    let mut e = SimEngine::start(opts).unwrap_or_else(|e| panic!("start: {e}"));
    for r in requests {
        e.run(r).unwrap_or_else(|e| panic!("request: {e}"));
    }
    e.report().clone()
}

#[test]
fn a_second_instance_of_the_same_computation_hits_byte_exact() {
    let d = Daemon::start();
    let reqs = synthetic(1, 24, 16);
    let first = run(&d, SimInstance::new("sim-a", 1), &reqs, &[]);
    assert_eq!(
        (first.errors, first.pages.wrong_bytes, first.unproven),
        (0, 0, 0)
    );
    assert!(first.pages.published > 0);
    let second = run(&d, SimInstance::new("sim-b-consumer", 1), &reqs, &[]);
    assert_eq!(
        (second.errors, second.pages.wrong_bytes, second.unproven),
        (0, 0, 0)
    );
    assert_eq!(second.pages.failed, 0);
    // Every request with a full block was published by the first instance.
    let with_blocks = reqs.iter().filter(|r| r.len() >= 16).count() as u64;
    assert_eq!(second.hits, with_blocks, "{second:?}");
    assert_eq!(second.proven_tokens, second.requested_tokens);
    assert!(second.pages.loaded > 0);
    // Another computation (one identity byte) shares nothing.
    let mut other = SimInstance::new("sim-c-consumer", 1);
    other.identity[0] ^= 1;
    let third = run(&d, other, &reqs, &[]);
    assert_eq!(third.hits, 0, "{third:?}");
}

#[test]
fn a_hybrid_instance_is_restored_only_at_proven_checkpoints() {
    let d = Daemon::start();
    let mut inst = SimInstance::new("hyb-a", 1);
    inst.contract = SimContract::Hybrid;
    let reqs = synthetic(3, 40, 16);
    let first = run(&d, inst.clone(), &reqs, &[]);
    assert_eq!(
        (first.errors, first.pages.wrong_bytes, first.unproven),
        (0, 0, 0)
    );
    inst.name = "hyb-b-consumer".into();
    let second = run(&d, inst, &reqs, &[]);
    assert_eq!(
        (second.errors, second.pages.wrong_bytes, second.unproven),
        (0, 0, 0)
    );
    assert!(second.hits > 0, "{second:?}");
    // Some requests share window pages but no checkpoint: those recompute.
    assert!(
        second.misses_by_name().contains_key("no_checkpoint"),
        "{:?}",
        second.misses_by_name()
    );
    assert!(second.proven_tokens < second.requested_tokens);
}

#[test]
fn a_two_rank_instance_hits_only_when_both_ranks_published() {
    let d = Daemon::start();
    let reqs = synthetic(4, 12, 16);
    // Rank 1 of the first instance never publishes.
    let first = run(&d, SimInstance::new("tp-a", 2), &reqs, &[1]);
    assert_eq!(first.errors, 0);
    let second = run(&d, SimInstance::new("tp-b-consumer", 2), &reqs, &[]);
    assert_eq!(second.hits, 0, "{second:?}");
    assert!(
        second.misses_by_name().contains_key("missing_rank"),
        "{:?}",
        second.misses_by_name()
    );
    // Once an instance with both ranks publishing has run, a consumer hits everything.
    let full = run(&d, SimInstance::new("tp-c", 2), &reqs, &[]);
    assert_eq!(full.errors, 0);
    let third = run(&d, SimInstance::new("tp-d-consumer", 2), &reqs, &[]);
    assert_eq!((third.pages.wrong_bytes, third.unproven), (0, 0));
    assert_eq!(third.proven_tokens, third.requested_tokens, "{third:?}");
}

#[test]
fn an_engine_without_a_scheduler_publishes_and_hits_byte_exact() {
    let d = Daemon::start();
    let reqs = synthetic(7, 12, 16);
    let mut inst = SimInstance::new("ns-a", 2);
    inst.no_scheduler = true;
    let first = run(&d, inst.clone(), &reqs, &[]);
    assert_eq!((first.errors, first.pages.wrong_bytes), (0, 0), "{first:?}");
    assert!(first.pages.published > 0);
    inst.name = "ns-b-consumer".into();
    let second = run(&d, inst, &reqs, &[]);
    assert_eq!(
        (second.errors, second.pages.wrong_bytes, second.unproven),
        (0, 0, 0),
        "{second:?}"
    );
    assert_eq!(second.proven_tokens, second.requested_tokens, "{second:?}");
}
