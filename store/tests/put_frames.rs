//! `StateStore::put_frames`: records whose frames were built in place are kept by the DRAM tier
//! as they are and written in one write (vectored out of their own buffers on packed segments,
//! gathered into one buffer on direct ones); every byte reads back
//! the same from the tier, from a write still in flight, from the file and after a reopen. A
//! store that compresses encodes them from their payloads instead. A refused bundle is left to
//! its caller. While the tier fills it keeps copies, and each frame comes back to its caller.

#![expect(
    clippy::unwrap_used,
    reason = "test code: a failed unwrap is a failed test"
)]

mod common;

use std::sync::Arc;

use common::*;
use orbitkv_segments::{Alignment, Compression, RecordMeta};
use orbitkv_store::io::Io;
use orbitkv_store::io::fault::{FaultIo, FaultPlan};
use orbitkv_store::{Durability, Error, FrameBuf, StateStore, StoreConfig};

/// Frames of records `from..to` (payloads of `len` bytes, seed `seed`), built for `store`.
fn frames(
    store: &StateStore,
    seed: u64,
    from: u64,
    to: u64,
    len: usize,
) -> Vec<(RecordMeta, FrameBuf)> {
    (from..to)
        .map(|i| {
            let mut f = store.frame_buf();
            let a = store.frame_alignment();
            f.begin(a, len).extend_from_slice(&payload(seed, i, len));
            f.finish(a).unwrap();
            (meta(i), f)
        })
        .collect()
}

fn all_read_back(store: &StateStore, seed: u64, to: u64, len: usize) {
    for i in 0..to {
        assert_eq!(check(store, seed, i, len), Some(true), "record {i}");
    }
}

#[test]
fn frames_built_in_place_read_back_everywhere_and_after_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let mut runs: Vec<(Arc<dyn Io>, Alignment)> = vec![(
        Arc::new(orbitkv_store::io::std_io::StdIo),
        Alignment::Packed,
    )];
    if let Some(direct) = direct_or_skip(dir.path()) {
        runs.push((Arc::new(direct), Alignment::Direct));
    }
    for (n, (io, alignment)) in runs.into_iter().enumerate() {
        let mut c = StoreConfig::new(dir.path().join(format!("data{n}")));
        c.durability = Durability::Group;
        c.alignment = alignment;
        c.segment_bytes = 4 << 20;
        // Room for 24 records (and evicted memory for 1.5 of them): the tier keeps frames,
        // evicts them and trades their memory.
        c.dram_bytes = 24 * 300_000;
        let store = StateStore::open(io.clone(), c.clone()).unwrap();
        store.register_namespace(NS, info()).unwrap();
        let mut traded = 0;
        for b in 0..16u64 {
            let mut bundle = frames(&store, 1, b * 4, b * 4 + 4, 300_000);
            let put = store.put_frames(&mut bundle, None).unwrap();
            let (receipt, memory) = (put.receipt, put.memory);
            assert!(bundle.is_empty(), "the store took the frames");
            assert_eq!(receipt.records, 4);
            assert_eq!(memory.len(), 4, "one answer per record");
            traded += memory.iter().flatten().count();
        }
        assert!(traded > 0, "evicted copies' memory came back");
        store.sync().unwrap();
        all_read_back(&store, 1, 64, 300_000);
        drop(store);
        let store = StateStore::open(io, c).unwrap();
        all_read_back(&store, 1, 64, 300_000);
    }
}

#[test]
fn while_the_tier_fills_each_gathered_frame_comes_back_to_its_caller() {
    let dir = tempfile::tempdir().unwrap();
    let Some(direct) = direct_or_skip(dir.path()) else {
        return;
    };
    let io: Arc<dyn Io> = Arc::new(direct);
    // A tier with room for every record, and none.
    for (n, dram_bytes) in [64u64 << 20, 0].into_iter().enumerate() {
        let mut c = StoreConfig::new(dir.path().join(format!("data{n}")));
        c.durability = Durability::Group;
        c.alignment = Alignment::Direct;
        c.dram_bytes = dram_bytes;
        let store = StateStore::open(io.clone(), c).unwrap();
        store.register_namespace(NS, info()).unwrap();
        for b in 0..4u64 {
            let mut bundle = frames(&store, 3, b * 4, b * 4 + 4, 300_000);
            let gathered = store.gather(&bundle.iter().map(|(_, f)| f).collect::<Vec<_>>());
            let memory = store.put_frames(&mut bundle, gathered).unwrap().memory;
            // The tier kept copies (or nothing): the caller's next copies need no new memory.
            assert!(
                memory
                    .iter()
                    .all(|m| m.as_ref().is_some_and(|f| f.capacity() >= 300_000)),
                "tier of {dram_bytes} bytes, bundle {b}: a frame kept from its caller"
            );
        }
        store.sync().unwrap();
        all_read_back(&store, 3, 16, 300_000);
    }
}

#[test]
fn frames_in_a_write_in_flight_are_read_from_it() {
    // Packed: one vectored write out of the frames' own buffers. Direct: the frames gathered
    // into one write buffer, under the writer's lock or beforehand (`StateStore::gather`).
    for (alignment, gather) in [
        (Alignment::Packed, false),
        (Alignment::Direct, false),
        (Alignment::Direct, true),
    ] {
        let io = FaultIo::new();
        let mut c = config(16 << 20, Durability::Manual);
        c.dram_bytes = 0;
        c.alignment = alignment;
        let store = open_with(&io, c.clone());
        io.set_plan(FaultPlan {
            defer_writes: true,
            ..FaultPlan::default()
        });
        // More than the write-behind tail takes: one write, left in flight.
        let mut bundle = frames(&store, 2, 0, 8, 200_000);
        let gathered = {
            let views: Vec<&FrameBuf> = bundle.iter().map(|(_, f)| f).collect();
            store.gather(&views)
        };
        assert_eq!(
            gathered.is_some(),
            alignment == Alignment::Direct,
            "gathered only for direct segments"
        );
        store
            .put_frames(&mut bundle, gathered.filter(|_| gather))
            .unwrap();
        all_read_back(&store, 2, 8, 200_000);
        // A small bundle goes to the write-behind tail as a copy, never gathered beforehand.
        let mut small = frames(&store, 2, 8, 9, 1000);
        assert!(store.gather(&[&small[0].1]).is_none());
        store.put_frames(&mut small, None).unwrap();
        assert_eq!(check(&store, 2, 8, 1000), Some(true));
        io.set_plan(FaultPlan::default());
        store.sync().unwrap();
        all_read_back(&store, 2, 8, 200_000);
        drop(store);
        let store = open_with(&io, c);
        all_read_back(&store, 2, 8, 200_000);
        assert_eq!(check(&store, 2, 8, 1000), Some(true));
    }
}

#[test]
fn frames_gathered_for_another_bundle_are_not_written() {
    let io = FaultIo::new();
    let mut c = config(16 << 20, Durability::Manual);
    c.alignment = Alignment::Direct;
    let store = open_with(&io, c.clone());
    let other = frames(&store, 9, 0, 6, 200_000);
    let views: Vec<&FrameBuf> = other.iter().map(|(_, f)| f).collect();
    let stale = store.gather(&views).unwrap();
    // Eight frames against a buffer of six, then six others of the same lengths: the store
    // gathers them itself.
    let mut bundle = frames(&store, 3, 0, 8, 200_000);
    store.put_frames(&mut bundle, Some(stale)).unwrap();
    let stale = store.gather(&views).unwrap();
    let mut six = frames(&store, 3, 8, 14, 200_000);
    store.put_frames(&mut six, Some(stale)).unwrap();
    store.sync().unwrap();
    drop(store);
    let store = open_with(&io, c);
    all_read_back(&store, 3, 14, 200_000);
    assert_eq!(store.stats().checksum_failures, 0);
}

#[test]
fn a_compressing_store_encodes_frames_from_their_payloads() {
    let io = FaultIo::new();
    let mut c = config(16 << 20, Durability::Group);
    c.compression = Compression::Zstd { level: 1 };
    let store = open_with(&io, c);
    assert!(!store.takes_frames());
    let mut bundle = frames(&store, 3, 0, 4, 50_000);
    let receipt = store.put_frames(&mut bundle, None).unwrap().receipt;
    assert_eq!(receipt.records, 4);
    store.sync().unwrap();
    all_read_back(&store, 3, 4, 50_000);
}

#[test]
fn a_refused_bundle_is_left_to_its_caller() {
    let io = FaultIo::new();
    let store = open(&io, 16 << 20, Durability::Group);
    let mut bundle = frames(&store, 4, 0, 2, 1000);
    bundle[1].0 = meta_in(orbitkv_state::Namespace([0x42; 32]), 1);
    let e = store.put_frames(&mut bundle, None).unwrap_err();
    assert!(matches!(e, Error::UnknownNamespace(_)), "{e}");
    assert_eq!(bundle.len(), 2, "nothing taken");
    assert_eq!(bundle[0].1.payload(), payload(4, 0, 1000).as_slice());
    // An unfinished frame is encoded from its payload: still stored, still exact.
    let mut f = store.frame_buf();
    f.begin(store.frame_alignment(), 10)
        .extend_from_slice(&payload(5, 7, 10));
    let mut bundle = vec![(meta(7), f)];
    store.put_frames(&mut bundle, None).unwrap();
    store.sync().unwrap();
    assert_eq!(check(&store, 5, 7, 10), Some(true));
}
