//! A compaction that fails before its commit leaves nothing behind: the output segments it had
//! created or sealed are deleted in the manifest and on disk. Left listed, a restart would index
//! their copies, bringing back records the store had reclaimed or retired meanwhile. A read
//! that fails under a compaction stops it: the live record is kept, not dropped as damaged, and
//! later compactions leave its segment out.

#![expect(
    clippy::unwrap_used,
    reason = "test code: a failed unwrap is a failed test"
)]

mod common;

use std::collections::BTreeSet;
use std::sync::Arc;

use common::*;
use orbitkv_store::io::Io;
use orbitkv_store::io::fault::{FaultIo, FaultPlan};
use orbitkv_store::{Durability, StateStore};

const SEG: u64 = 24 << 10;

/// Every segment the manifest lists, sealed or active.
fn listed(s: &StateStore) -> BTreeSet<u64> {
    s.segment_stats().unwrap().iter().map(|st| st.id).collect()
}

fn reopen(io: &FaultIo) -> StateStore {
    StateStore::open(
        Arc::new(io.clone()) as Arc<dyn Io>,
        config(SEG, Durability::EveryPut),
    )
    .unwrap()
}

/// A store of 40 records, the even ones put again (their first versions dead), reopened so
/// that the segment active at the end is sealed and listed too.
fn half_superseded(io: &FaultIo) -> StateStore {
    let s = open(io, SEG, Durability::EveryPut);
    for i in 0..40 {
        put_version(&s, i, 0);
    }
    for i in (0..40).step_by(2) {
        put_version(&s, i, 1);
    }
    drop(s);
    reopen(io)
}

#[test]
fn a_compaction_failing_at_any_sync_leaves_no_output_listed() {
    let mut failures = 0;
    for k in 1..=40u64 {
        let io = FaultIo::new();
        let s = half_superseded(&io);
        let before = listed(&s);
        io.set_plan(FaultPlan {
            fail_sync: Some(k),
            ..Default::default()
        });
        let r = s.compact_below(0.6);
        io.set_plan(FaultPlan::default());
        if r.is_ok() {
            continue;
        }
        failures += 1;
        // Every output is gone, now and after a restart (the page cache intact).
        let now = listed(&s);
        assert!(
            now.is_subset(&before),
            "sync {k}: {now:?} beyond {before:?}"
        );
        drop(s);
        let s = reopen(&io);
        let after = listed(&s);
        assert!(
            after.is_subset(&before),
            "sync {k}: after reopening, {after:?} beyond {before:?}"
        );
        for i in 0..40u64 {
            let v = u64::from(i.is_multiple_of(2));
            assert_eq!(
                check(&s, 100 + v, i, 3000),
                Some(true),
                "sync {k}: record {i}"
            );
        }
    }
    assert!(failures >= 3, "{failures} compactions failed");
}

#[test]
fn a_read_failing_under_a_compaction_keeps_the_live_record() {
    let io = FaultIo::new();
    let s = half_superseded(&io);
    // A live record of the first segment (odd keys were put once) sits on a sector that
    // fails to read for a while.
    let rec = s.index().get(&key(1)).unwrap();
    let segment = format!("{:08x}.seg", rec.segment);
    io.set_plan(FaultPlan {
        fail_read_at: Some((segment, rec.offset + 100)),
        ..Default::default()
    });
    let r = s.compact_below(0.9);
    assert!(
        r.is_err(),
        "the compaction went on past a failed read: {r:?}"
    );
    // The sector still fails: the next compaction leaves its segment out and goes on.
    let report = s.compact_below(0.9).unwrap();
    assert!(report.copied > 0, "{report:?}");
    assert!(
        s.segments()
            .iter()
            .any(|(id, _)| *id == u64::from(rec.segment))
    );
    io.set_plan(FaultPlan::default());
    // The sector reads again: every record is served, now and after a restart.
    for i in 0..40u64 {
        let v = u64::from(i.is_multiple_of(2));
        assert_eq!(check(&s, 100 + v, i, 3000), Some(true), "record {i}");
    }
    drop(s);
    let s = reopen(&io);
    for i in 0..40u64 {
        let v = u64::from(i.is_multiple_of(2));
        assert_eq!(
            check(&s, 100 + v, i, 3000),
            Some(true),
            "record {i} after a restart"
        );
    }
}
