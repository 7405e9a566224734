//! A manifest append that fails (its write or its fsync) never takes effect: the record is
//! rolled back out of the file, so reopening the store — after a restart without a power loss,
//! with the page cache intact — finds it absent, and the sequence it would have taken stays
//! free. When the rollback fails too, every later manifest append is refused with a typed
//! reason until the store is opened again.

#![expect(
    clippy::unwrap_used,
    reason = "test code: a failed unwrap is a failed test"
)]

mod common;

use std::sync::Arc;

use common::*;
use orbitkv_store::io::Io;
use orbitkv_store::io::fault::{FaultIo, FaultPlan};
use orbitkv_store::{Durability, Error, StateStore, WriteRefusal};

const LEN: usize = 3000;

fn reopen(io: &FaultIo) -> StateStore {
    StateStore::open(
        Arc::new(io.clone()) as Arc<dyn Io>,
        config(1 << 20, Durability::EveryPut),
    )
    .unwrap()
}

#[test]
fn a_retire_whose_fsync_failed_does_not_take_effect_at_the_next_open() {
    let io = FaultIo::new();
    let s = open(&io, 1 << 20, Durability::EveryPut);
    put_range(&s, 3, 0, 8, LEN);
    // The retirement's manifest fsync fails: the caller gets an error.
    io.set_plan(FaultPlan {
        fail_sync: Some(1),
        ..Default::default()
    });
    assert!(s.retire_namespace(NS).is_err());
    io.set_plan(FaultPlan::default());
    // The store goes on: a later manifest record (a retirement that succeeds) takes the
    // sequence the failed one did not.
    drop(s);
    // A restart without a power loss: what the page cache holds is read back.
    let s = reopen(&io);
    for i in 0..8 {
        assert_eq!(
            check(&s, 3, i, LEN),
            Some(true),
            "record {i} after the failed retire"
        );
    }
    s.retire_namespace(NS).unwrap();
    drop(s);
    let s = reopen(&io);
    assert_eq!(
        check(&s, 3, 0, LEN),
        None,
        "the retirement that succeeded holds"
    );
}

#[test]
fn a_failed_rollback_refuses_later_manifest_appends_until_reopened() {
    let io = FaultIo::new();
    let s = open(&io, 1 << 20, Durability::EveryPut);
    put_range(&s, 4, 0, 4, LEN);
    // The manifest write succeeds, its fsync fails, and so does everything after (the
    // truncation that would roll it back included).
    io.set_plan(FaultPlan {
        halt_after_ops: Some(1),
        ..Default::default()
    });
    assert!(s.retire_namespace(NS).is_err());
    io.set_plan(FaultPlan::default());
    match s.retire_namespace(NS) {
        Err(Error::WritesRefused(WriteRefusal::ManifestUncertain { detail })) => {
            assert!(detail.contains("rolling back"), "{detail}");
        }
        other => panic!("{other:?}"),
    }
}
