//! With manual durability, a synced record superseded by a put not yet synced is dead in the
//! index but still the key's only durable copy. Compaction and reclaim drop dead records, so
//! they first make the successors durable: a power loss never takes both. Found by the
//! `store_model` fuzz target.

mod common;

use common::*;
use orbitkv_store::io::fault::{Crash, FaultIo};
use orbitkv_store::{Durability, StoreConfig};

const LEN: usize = 3000;

#[test]
fn compaction_does_not_drop_a_synced_record_for_an_unsynced_successor() {
    let io = FaultIo::new();
    let store = open(&io, 16 << 10, Durability::Manual);
    let v1 = payload(1, 0, LEN);
    store
        .put(&[(meta(0), v1.as_slice())])
        .unwrap_or_else(|e| panic!("{e}"));
    // Enough others to seal the segment holding v1, all synced.
    put_range(&store, 1, 1, 12, LEN);
    store.sync().unwrap_or_else(|e| panic!("{e}"));
    let v2 = payload(2, 0, LEN);
    store
        .put(&[(meta(0), v2.as_slice())])
        .unwrap_or_else(|e| panic!("{e}"));
    let r = store.compact_below(1.0).unwrap_or_else(|e| panic!("{e}"));
    assert!(r.dropped_dead >= 1, "{r:?}");
    io.crash(Crash::DropUnsynced);
    drop(store);
    let store = open(&io, 16 << 10, Durability::Manual);
    let mut out = Vec::new();
    let got = store
        .get(&key(0), &mut out)
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        got.is_some(),
        "both the synced record and its successor were lost"
    );
    assert!(out == v1 || out == v2);
}

/// Puts v1 of key 0 and syncs, then 4 KiB fillers (unread, unsynced); at position `v2_at`,
/// v2 of key 0, and 1-byte fillers after it. Stops at the first reclaim, or when v2's segment
/// is sealed first; returns the store, its I/O, the position reached and whether the reclaim
/// came while v2's segment was still active (unsynced).
fn scenario(v2_at: u64) -> (FaultIo, orbitkv_store::StateStore, u64, bool) {
    let io = FaultIo::new();
    let store = open_with(&io, bounded());
    let v1 = payload(1, 0, 4096);
    store
        .put(&[(meta(0), v1.as_slice())])
        .unwrap_or_else(|e| panic!("{e}"));
    store.sync().unwrap_or_else(|e| panic!("{e}"));
    let mut i = 1;
    loop {
        let (m, p) = match i.cmp(&v2_at) {
            std::cmp::Ordering::Less => (meta(i), payload(1, i, 4096)),
            std::cmp::Ordering::Equal => (meta(0), payload(2, 0, 4096)),
            std::cmp::Ordering::Greater => (meta(i), payload(1, i, 1)),
        };
        store
            .put(&[(m, p.as_slice())])
            .unwrap_or_else(|e| panic!("{e}"));
        if i >= v2_at {
            let seg = store.index().get(&key(0)).map(|r| u64::from(r.segment));
            let active = store
                .segments()
                .iter()
                .any(|(id, sealed)| Some(*id) == seg && !sealed);
            if store.stats().reclaimed_segments > 0 {
                return (io, store, i, active);
            }
            if !active {
                return (io, store, i, false);
            }
        } else if store.stats().reclaimed_segments > 0 {
            return (io, store, i, false);
        }
        i += 1;
    }
}

fn bounded() -> StoreConfig {
    let mut c = StoreConfig::new("data");
    c.durability = Durability::Manual;
    // 64 KiB segments: room after v2 for the small puts that bring on the reclaim.
    c.ssd_bytes = Some(4 << 20);
    c
}

#[test]
fn reclaim_does_not_drop_a_synced_record_for_an_unsynced_successor() {
    // Find where v2 must go for the first reclaim (of v1's segment, the oldest) to come while
    // v2 sits unsynced in the active segment; then lose power right there.
    let (_, _, first, _) = scenario(u64::MAX);
    let found = (first.saturating_sub(24)..first).find_map(|at| {
        let (io, store, _, unsynced_at_reclaim) = scenario(at);
        unsynced_at_reclaim.then_some((io, store))
    });
    let Some((io, store)) = found else {
        panic!("no placement of v2 puts the first reclaim before its segment is sealed");
    };
    io.crash(Crash::DropUnsynced);
    drop(store);
    let store = open_with(&io, bounded());
    let mut out = Vec::new();
    let got = store
        .get(&key(0), &mut out)
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        got.is_some(),
        "the synced record was reclaimed while its successor was not durable"
    );
    assert!(out == payload(1, 0, 4096) || out == payload(2, 0, 4096));
}
