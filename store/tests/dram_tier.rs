//! The DRAM tier: copies of hot records are served from memory, only while the index names
//! exactly that record (a newer version, a retirement or a reclaim makes them unreachable), and
//! it stays within its budget.

mod common;

use common::*;
use orbitkv_store::io::fault::{FaultIo, FaultPlan};
use orbitkv_store::{Durability, StateStore, StoreConfig};

const LEN: usize = 4096;

fn open_dram(io: &FaultIo, dram: u64) -> StateStore {
    let mut c = StoreConfig::new("data");
    c.durability = Durability::EveryPut;
    c.dram_bytes = dram;
    open_with(io, c)
}

#[test]
fn hot_records_are_served_from_dram_without_touching_the_disk() {
    let io = FaultIo::new();
    let store = open_dram(&io, 1 << 20);
    put_range(&store, 1, 0, 10, LEN);
    // Reads of segment files now fail: only DRAM can serve.
    io.set_plan(FaultPlan {
        fail_reads_of: Some("segments".into()),
        ..Default::default()
    });
    for i in 0..10 {
        assert_eq!(check(&store, 1, i, LEN), Some(true), "record {i}");
    }
    let s = store.stats();
    assert_eq!((s.dram_hits, s.read_errors), (10, 0));
}

#[test]
fn a_copy_is_served_only_while_it_is_the_indexed_record() {
    let io = FaultIo::new();
    let store = open_dram(&io, 1 << 20);
    put_range(&store, 1, 0, 4, LEN);
    let newer = payload(7, 2, LEN);
    store.put(&[(meta(2), newer.as_slice())]).unwrap();
    let mut out = Vec::new();
    store.get(&key(2), &mut out).unwrap().unwrap();
    assert_eq!(out, newer);
    store.retire_namespace(NS).unwrap();
    for i in 0..4 {
        assert_eq!(check(&store, 1, i, LEN), None, "retired record {i}");
    }
}

#[test]
fn the_tier_stays_within_its_budget_and_misses_fall_through_to_ssd() {
    let io = FaultIo::new();
    let store = open_dram(&io, 64 * LEN as u64);
    put_range(&store, 3, 0, 1_000, LEN);
    let u = store.usage();
    assert!(u.dram_used <= 64 * LEN as u64, "{u:?}");
    assert!(u.dram_entries <= 64);
    // The newest copies are in DRAM; the rest come from SSD.
    for i in (990..1_000).chain(0..1_000) {
        assert_eq!(check(&store, 3, i, LEN), Some(true), "record {i}");
    }
    let s = store.stats();
    assert!(s.dram_hits >= 10 && s.dram_hits < 1_000, "{s:?}");
    assert!(store.usage().dram_used <= 64 * LEN as u64);
}
