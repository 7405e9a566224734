//! Compaction rewrites sealed segments with only their live records and deletes them: current
//! records stay byte-exact (before and after a restart), superseded and retired ones are dropped
//! for good, a crash at any step loses no live record and resurrects no dead one, and readers
//! racing a compaction never see wrong bytes.

mod common;

use std::sync::Arc;

use common::*;
use orbitkv_state::Namespace;
use orbitkv_store::io::Io;
use orbitkv_store::io::fault::{Crash, FaultIo, FaultPlan};
use orbitkv_store::{Durability, StateStore};

const SEG: u64 = 24 << 10;

fn check_version(s: &StateStore, i: u64, v: u64) -> Option<bool> {
    check(s, 100 + v, i, 3000)
}

/// 40 records, then newer versions of the even ones: the old segments are half dead.
fn fill(s: &StateStore) {
    for i in 0..40 {
        put_version(s, i, 0);
    }
    for i in (0..40).step_by(2) {
        put_version(s, i, 1);
    }
}

fn current(i: u64) -> u64 {
    u64::from(i.is_multiple_of(2))
}

#[test]
fn compaction_keeps_live_records_and_frees_dead_ones() {
    let io = FaultIo::new();
    let s = open(&io, SEG, Durability::EveryPut);
    fill(&s);
    let before = s.segment_stats().unwrap();
    assert!(before.iter().any(|st| st.live_fraction() < 0.6));
    let r = s.compact_below(0.6).unwrap();
    assert!(!r.inputs.is_empty() && r.dropped_dead >= 10, "{r:?}");
    assert!(r.output_bytes < r.input_bytes);
    for i in 0..40 {
        assert_eq!(check_version(&s, i, current(i)), Some(true), "record {i}");
    }
    for id in &r.inputs {
        assert!(!io.exists(&std::path::Path::new("data/segments").join(format!("{id:08x}.seg"))));
    }
    assert!(
        s.segment_stats()
            .unwrap()
            .iter()
            .all(|st| !r.inputs.contains(&st.id))
    );
    drop(s);
    io.crash(Crash::DropUnsynced);
    let s = open(&io, SEG, Durability::EveryPut);
    for i in 0..40 {
        assert_eq!(
            check_version(&s, i, current(i)),
            Some(true),
            "record {i} after restart"
        );
    }
}

#[test]
fn retired_records_are_dropped_by_compaction_for_good() {
    let io = FaultIo::new();
    let other = Namespace([0x44; 32]);
    let s = open(&io, SEG, Durability::EveryPut);
    s.register_namespace(other, info()).unwrap();
    for i in 0..20 {
        put_version(&s, i, 0);
        let p = payload(7, i, 3000);
        s.put(&[(meta_in(other, i), p.as_slice())]).unwrap();
    }
    s.retire_namespace(NS).unwrap();
    s.close().unwrap();
    let s = open(&io, SEG, Durability::EveryPut);
    let r = s.compact_below(0.99).unwrap();
    assert!(r.dropped_dead >= 20, "{r:?}");
    drop(s);
    let s = open(&io, SEG, Durability::EveryPut);
    let mut out = Vec::new();
    for i in 0..20 {
        assert_eq!(check_version(&s, i, 0), None, "retired record {i}");
        assert!(
            s.get(&key_in(other, i), &mut out).unwrap().is_some(),
            "other namespace {i}"
        );
        assert_eq!(out, payload(7, i, 3000));
    }
}

#[test]
fn a_crash_at_any_step_of_a_compaction_loses_nothing_live() {
    // Count the operations of one compaction.
    let probe = FaultIo::new();
    let s = open(&probe, SEG, Durability::EveryPut);
    fill(&s);
    probe.set_plan(FaultPlan::default());
    s.compact_below(0.6).unwrap();
    let total = probe.counters().ops;
    drop(s);
    assert!(total > 10, "{total}");
    for n in 0..=total {
        let io = FaultIo::new();
        let s = open(&io, SEG, Durability::EveryPut);
        fill(&s);
        io.set_plan(FaultPlan {
            halt_after_ops: Some(n),
            ..Default::default()
        });
        let _ = s.compact_below(0.6);
        drop(s);
        io.crash(Crash::TornPages(n + 1));
        let s = StateStore::open(
            Arc::new(io.clone()) as Arc<dyn Io>,
            config(SEG, Durability::EveryPut),
        )
        .unwrap();
        for i in 0..40 {
            assert_eq!(
                check_version(&s, i, current(i)),
                Some(true),
                "halt after {n}: record {i}"
            );
            // (The current version being served means the superseded one is not.)
        }
    }
}

#[test]
fn readers_racing_a_compaction_never_see_wrong_bytes() {
    let io = FaultIo::new();
    let s = Arc::new(open(&io, SEG, Durability::EveryPut));
    fill(&s);
    let reader = {
        let s = s.clone();
        std::thread::spawn(move || {
            for _ in 0..20 {
                for i in 0..40 {
                    let got = check_version(&s, i, current(i));
                    assert_ne!(got, Some(false), "record {i} read with different bytes");
                }
            }
        })
    };
    s.compact_below(0.6).unwrap();
    reader.join().unwrap();
    for i in 0..40 {
        assert_eq!(check_version(&s, i, current(i)), Some(true));
    }
}

#[test]
fn compaction_drops_the_dram_copies_of_the_records_it_moves() {
    let io = FaultIo::new();
    let mut c = config(SEG, Durability::EveryPut);
    c.dram_bytes = 8 << 20;
    let s = open_with(&io, c);
    fill(&s);
    let before = s.usage().dram_entries;
    let r = s.compact_below(0.6).unwrap();
    assert!(r.copied > 0, "{r:?}");
    // A copy names its old sequence, which no index entry names any more: it is gone.
    assert_eq!(s.usage().dram_entries, before - r.copied);
    for i in 0..40 {
        assert_eq!(check_version(&s, i, current(i)), Some(true), "record {i}");
    }
    // The copies came back under the moved records' new sequences and serve the next reads.
    let hits = s.stats().dram_hits;
    for i in 0..40 {
        assert_eq!(check_version(&s, i, current(i)), Some(true), "record {i}");
    }
    assert_eq!(s.stats().dram_hits, hits + 40);
}
