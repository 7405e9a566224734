//! A pinned record's bytes stay readable until it is unpinned — through supersession, compaction
//! and reclaiming, but not past its namespace's retirement — and the segment holding it is
//! neither compacted nor reclaimed meanwhile; unpinned, it is.

mod common;

use common::*;
use orbitkv_store::io::fault::FaultIo;
use orbitkv_store::{Durability, Policy, StoreConfig};

const LEN: usize = 4096;

#[test]
fn a_pin_outlives_supersession_and_compaction_but_not_retirement() {
    let io = FaultIo::new();
    let store = open(&io, 64 << 10, Durability::EveryPut);
    put_range(&store, 1, 0, 40, LEN);
    let pin = store.pin(&key(3)).unwrap();
    let pinned_segment = store.index().get(&key(3)).unwrap().segment;
    // Superseded by a newer record of the same key.
    let newer = payload(9, 3, LEN);
    store.put(&[(meta(3), newer.as_slice())]).unwrap();
    let mut out = Vec::new();
    store.get(&key(3), &mut out).unwrap().unwrap();
    assert_eq!(out, newer, "get serves the newest");
    store.get_pinned(pin, &mut out).unwrap().unwrap();
    assert_eq!(out, payload(1, 3, LEN), "the pin serves what it pinned");
    // Retired: nothing older than the watermark is served, not even through the pin.
    store.retire_namespace(NS).unwrap();
    assert_eq!(check(&store, 1, 5, LEN), None);
    assert!(store.get_pinned(pin, &mut out).unwrap().is_none());
    // Every segment is now dead; compaction skips the pinned one.
    let report = store.compact_below(1.0).unwrap();
    assert!(!report.inputs.is_empty());
    assert!(!report.inputs.contains(&u64::from(pinned_segment)));
    assert!(store.get_pinned(pin, &mut out).unwrap().is_none());
    assert!(store.unpin(pin));
    assert!(!store.unpin(pin), "a pin is released once");
    assert!(store.get_pinned(pin, &mut out).unwrap().is_none());
    let report = store.compact_below(1.0).unwrap();
    assert!(report.inputs.contains(&u64::from(pinned_segment)));
}

#[test]
fn a_pin_outlives_reclaiming_and_its_segment_is_kept() {
    let mut c = StoreConfig::new("data");
    c.durability = Durability::Manual;
    c.ssd_bytes = Some(1 << 20);
    c.policy = Policy::Fifo;
    let store = open_with(&FaultIo::new(), c);
    put_range(&store, 2, 0, 5, LEN);
    let pin = store.pin(&key(1)).unwrap();
    let segment = |i| store.index().get(&key(i)).map(|r| r.segment);
    let neighbours: Vec<u64> = (0..5).filter(|&i| segment(i) == segment(1)).collect();
    put_range(&store, 2, 5, 2_000, LEN);
    assert!(store.stats().reclaimed_segments > 10);
    // The pinned segment was skipped, so its records are all still indexed.
    for &i in &neighbours {
        assert_eq!(check(&store, 2, i, LEN), Some(true), "record {i}");
    }
    let mut out = Vec::new();
    store.get_pinned(pin, &mut out).unwrap().unwrap();
    assert_eq!(out, payload(2, 1, LEN));
    assert!(store.unpin(pin));
    put_range(&store, 2, 2_000, 2_400, LEN);
    assert_eq!(check(&store, 2, 1, LEN), None, "unpinned, it is reclaimed");
    assert_eq!(store.usage().pins, 0);
}

#[test]
fn nothing_stored_cannot_be_pinned() {
    let io = FaultIo::new();
    let store = open(&io, 64 << 10, Durability::EveryPut);
    assert!(store.pin(&key(1)).is_none());
}

#[test]
fn with_pinned_lends_the_dram_copy_or_reads_verified_bytes() {
    let mut c = StoreConfig::new("data");
    c.durability = Durability::Manual;
    c.dram_bytes = 1 << 20;
    let store = open_with(&FaultIo::new(), c);
    put_range(&store, 4, 0, 3, LEN);
    let mut scratch = Vec::new();
    for i in 0..3 {
        let pin = store.pin(&key(i)).unwrap();
        let before = store.stats().dram_hits;
        let got = store
            .with_pinned(pin, &mut scratch, <[u8]>::to_vec)
            .unwrap()
            .unwrap();
        assert_eq!(got, payload(4, i, LEN));
        // A record just put is in the DRAM tier: lent, not read into the scratch buffer.
        assert_eq!(store.stats().dram_hits, before + 1);
        assert!(store.unpin(pin));
        assert!(
            store
                .with_pinned(pin, &mut scratch, |_| ())
                .unwrap()
                .is_none(),
            "an unpinned pin lends nothing"
        );
    }
    // Without a DRAM tier the bytes come from the segment, verified, into the scratch buffer.
    let io = FaultIo::new();
    let store = open(&io, 64 << 10, Durability::EveryPut);
    put_range(&store, 5, 0, 2, LEN);
    let pin = store.pin(&key(1)).unwrap();
    let n = store
        .with_pinned(pin, &mut scratch, |b| {
            assert_eq!(b, payload(5, 1, LEN).as_slice());
            b.len()
        })
        .unwrap();
    assert_eq!(n, Some(LEN));
    assert_eq!(scratch, payload(5, 1, LEN));
}
