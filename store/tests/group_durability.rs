//! `Durability::Group`: a put is written at once but its records are readable only once a sync
//! (or the seal of their segment) has made them durable — so a failed write or fsync never
//! takes away a record anybody read — and one sync covers every put before it. A sync after
//! records were lost says so (`Error::Lost`), so no caller takes them for durable.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use common::*;
use orbitkv_store::io::fault::{Crash, FaultIo, FaultPlan};
use orbitkv_store::{Durability, Error, Retry, StateStore};

const LEN: usize = 2000;

fn group(io: &FaultIo, segment_bytes: u64) -> StateStore {
    open(io, segment_bytes, Durability::Group)
}

#[test]
fn a_record_is_readable_only_once_a_sync_made_it_durable() {
    let io = FaultIo::new();
    let store = group(&io, 1 << 20);
    put_range(&store, 1, 0, 4, LEN);
    for i in 0..4 {
        assert_eq!(check(&store, 1, i, LEN), None, "record {i} before the sync");
        assert!(store.pin(&key(i)).is_none());
    }
    assert_eq!(store.probe(&[key(0)]), 0);
    store.sync().unwrap();
    for i in 0..4 {
        assert_eq!(
            check(&store, 1, i, LEN),
            Some(true),
            "record {i} after the sync"
        );
    }
    // A newer version is held back too: the older one serves until the sync.
    let newer = payload(2, 0, LEN);
    store.put(&[(meta(0), newer.as_slice())]).unwrap();
    assert_eq!(check(&store, 1, 0, LEN), Some(true));
    store.sync().unwrap();
    assert_eq!(check(&store, 2, 0, LEN), Some(true));
}

#[test]
fn the_seal_of_a_full_segment_makes_its_records_readable() {
    let io = FaultIo::new();
    let store = group(&io, 64 << 10);
    // Enough to fill several segments: each seal makes what it holds durable.
    put_range(&store, 3, 0, 100, LEN);
    let readable = (0..100)
        .filter(|&i| check(&store, 3, i, LEN) == Some(true))
        .count();
    assert!(
        readable > 0 && readable < 100,
        "{readable} readable before the sync"
    );
    store.sync().unwrap();
    for i in 0..100 {
        assert_eq!(check(&store, 3, i, LEN), Some(true), "record {i}");
    }
}

#[test]
fn records_lost_to_a_failed_write_were_never_readable_and_the_sync_says_so() {
    let io = FaultIo::new();
    let store = group(&io, 16 << 20);
    put_range(&store, 4, 0, 3, LEN);
    store.sync().unwrap();
    // Small puts wait in the write-behind tail; the large one is written at once, and its
    // write fails: it is refused, and the records put since the last sync are lost with it.
    put_range(&store, 4, 3, 6, LEN);
    io.set_plan(FaultPlan {
        fail_write: Some(1),
        ..Default::default()
    });
    let big = payload(4, 6, 2 << 20);
    assert!(store.put(&[(meta(6), big.as_slice())]).is_err());
    io.set_plan(FaultPlan::default());
    match store.sync() {
        Err(e @ Error::Lost { .. }) => assert_eq!(e.retry(), Retry::After(Default::default())),
        other => panic!("the loss was not reported: {other:?}"),
    }
    for i in 0..3 {
        assert_eq!(check(&store, 4, i, LEN), Some(true), "durable record {i}");
    }
    for i in 3..6 {
        assert_eq!(check(&store, 4, i, LEN), None, "lost record {i}");
    }
    // Put again, they are durable and readable; the next sync reports nothing lost.
    put_range(&store, 4, 3, 6, LEN);
    store.sync().unwrap();
    for i in 0..6 {
        assert_eq!(check(&store, 4, i, LEN), Some(true), "record {i}");
    }
}

#[test]
fn a_write_that_fails_in_the_sync_leaves_nothing_readable() {
    let io = FaultIo::new();
    let store = group(&io, 16 << 20);
    put_range(&store, 7, 0, 4, LEN);
    io.set_plan(FaultPlan {
        fail_write: Some(1),
        ..Default::default()
    });
    assert!(store.sync().is_err());
    io.set_plan(FaultPlan::default());
    for i in 0..4 {
        assert_eq!(check(&store, 7, i, LEN), None, "record {i}");
    }
    // The failure was reported by that sync: the next one has nothing to report.
    put_range(&store, 7, 0, 4, LEN);
    store.sync().unwrap();
    for i in 0..4 {
        assert_eq!(check(&store, 7, i, LEN), Some(true), "record {i}");
    }
}

#[test]
fn a_record_retired_while_held_back_never_becomes_readable() {
    let io = FaultIo::new();
    let store = group(&io, 16 << 20);
    put_range(&store, 8, 0, 3, LEN);
    store.retire_namespace(NS).unwrap();
    put_range(&store, 9, 3, 4, LEN);
    store.sync().unwrap();
    for i in 0..3 {
        assert_eq!(check(&store, 8, i, LEN), None, "retired record {i}");
    }
    assert_eq!(
        check(&store, 9, 3, LEN),
        Some(true),
        "a record put after the retirement"
    );
}

#[test]
fn a_compaction_copy_never_overtakes_a_record_held_back() {
    let io = FaultIo::new();
    let store = group(&io, 64 << 10);
    // Version 1 of records 0..40 across several sealed segments.
    put_range(&store, 10, 0, 40, LEN);
    store.sync().unwrap();
    // Version 2 of record 0, held back; then every sealed segment is rewritten.
    let newer = payload(12, 0, LEN);
    assert_ne!(newer, payload(10, 0, LEN));
    store.put(&[(meta(0), newer.as_slice())]).unwrap();
    let sealed: Vec<u64> = store
        .segments()
        .into_iter()
        .filter(|(_, sealed)| *sealed)
        .map(|(id, _)| id)
        .collect();
    let report = store.compact(&sealed).unwrap();
    assert!(!report.inputs.is_empty());
    store.sync().unwrap();
    assert_eq!(check(&store, 12, 0, LEN), Some(true));
    // Also after a restart, where sequences decide.
    store.close().unwrap();
    let store = group(&io, 64 << 10);
    assert_eq!(check(&store, 12, 0, LEN), Some(true));
    for i in 1..40 {
        assert_eq!(check(&store, 10, i, LEN), Some(true), "record {i}");
    }
}

#[test]
fn a_failed_fsync_leaves_nothing_readable_and_a_power_loss_nothing_wrong() {
    let io = FaultIo::new();
    let store = group(&io, 1 << 20);
    put_range(&store, 5, 0, 4, LEN);
    io.set_plan(FaultPlan {
        fail_sync: Some(1),
        ..Default::default()
    });
    assert!(store.sync().is_err());
    io.set_plan(FaultPlan::default());
    for i in 0..4 {
        assert_eq!(check(&store, 5, i, LEN), None, "record {i}");
    }
    put_range(&store, 5, 4, 8, LEN);
    drop(store);
    io.crash(Crash::TornPages(7));
    let store = group(&io, 1 << 20);
    for i in 0..8 {
        // Whatever the device kept comes back whole, or not at all.
        assert_ne!(check(&store, 5, i, LEN), Some(false), "record {i}");
    }
}

#[test]
fn readers_racing_puts_never_see_a_record_before_its_sync() {
    let io = FaultIo::new();
    // Large segments: no seal makes anything durable early.
    let store = Arc::new(group(&io, 64 << 20));
    // The writer's state, one word: records below `synced` are durable (`synced << 1`), and
    // whether a sync is under way (bit 0).
    let state = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let reader = {
        let (store, state, stop) = (store.clone(), state.clone(), stop.clone());
        std::thread::spawn(move || {
            let (mut early, mut reads) = (0u64, 0u64);
            while !stop.load(Ordering::Acquire) {
                let before = state.load(Ordering::Acquire);
                let next = (before >> 1) + 5;
                let mut out = Vec::new();
                let found = store.get(&key(next), &mut out).unwrap().is_some();
                let after = state.load(Ordering::Acquire);
                if found {
                    assert_eq!(out, payload(6, next, LEN));
                    // No sync began or ended around the read: the record was not durable.
                    if before == after && before & 1 == 0 {
                        early += 1;
                    }
                }
                reads += 1;
            }
            (early, reads)
        })
    };
    for round in 0..200u64 {
        let base = round * 10;
        put_range(&store, 6, base, base + 10, LEN);
        state.store((base << 1) | 1, Ordering::Release);
        store.sync().unwrap();
        state.store((base + 10) << 1, Ordering::Release);
    }
    stop.store(true, Ordering::Release);
    let (early, reads) = reader.join().unwrap();
    assert_eq!(
        early, 0,
        "{early} of {reads} reads saw a record before its sync"
    );
    assert!(reads > 0);
}
