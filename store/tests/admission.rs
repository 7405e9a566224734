//! Adaptive SSD admission: once the SSD tier is full, records put for the first time wait in
//! DRAM where holding them back loses no hit, and are served exactly from there; a waiting
//! record read is written at the next put and survives a crash, one never read is lost to a
//! crash and never served wrong; a key put again while the ghost remembers it is written; a
//! record read while waiting never stands in front of a newer put, and is not written once
//! retired; a pin reads a waiting record and holds its bytes, and retirement refuses it; where
//! records come back after leaving the room, nothing is held back.

#![expect(
    clippy::unwrap_used,
    reason = "test code: a failed unwrap is a failed test"
)]

mod common;

use common::*;
use orbitkv_index::Tier;
use orbitkv_segments::{Alignment, RecordMeta};
use orbitkv_store::io::fault::{Crash, FaultIo};
use orbitkv_store::{
    Admission, Durability, FrameBuf, Policy, StateStore, StoreConfig, ssd_bytes_holding,
};

const LEN: usize = 16 << 10;

/// `record-lru` over `records` records of [`LEN`], a waiting room of `waiting` of them.
fn admitting(records: u64, waiting: u64) -> StoreConfig {
    let mut c = StoreConfig::new("data");
    c.durability = Durability::Manual;
    c.ssd_bytes = Some(ssd_bytes_holding(records, LEN as u64, Alignment::Direct));
    c.policy = Policy::RecordLru;
    c.admission = Admission::Adaptive {
        waiting_bytes: waiting * LEN as u64,
    };
    c
}

fn tier(store: &StateStore, i: u64) -> Option<Tier> {
    store.index().get(&key(i)).map(|r| r.tier)
}

/// One-shot traffic: `0..n`, one record a put.
fn one_shot(store: &StateStore, n: u64) {
    put_range(store, 1, 0, n, LEN);
    store.sync().unwrap();
}

/// One-shot traffic of 1,000 records, then the last two that wait in DRAM, newest first.
fn two_waiting(store: &StateStore) -> (u64, u64) {
    one_shot(store, 1_000);
    let waiting: Vec<u64> = (0..1_000)
        .filter(|&i| tier(store, i) == Some(Tier::Dram))
        .collect();
    assert!(waiting.len() >= 2, "{waiting:?}");
    (waiting[waiting.len() - 1], waiting[waiting.len() - 2])
}

#[test]
fn one_shot_traffic_waits_in_dram_once_the_tier_is_full_and_is_served_exactly() {
    let io = FaultIo::new();
    let c = admitting(100, 20);
    let budget = c.ssd_bytes.unwrap();
    let store = open_with(&io, c);
    one_shot(&store, 1_000);
    let s = store.stats();
    assert!(s.held_records > 600, "{s:?}");
    assert_eq!(s.put_records + s.held_records, 1_000);
    let u = store.usage();
    assert!(u.waiting_bytes <= 20 * LEN as u64, "{u:?}");
    assert!(u.waiting_records > 0);
    assert!(u.ssd_used <= budget, "{u:?}");
    let mut waiting = 0;
    for i in 0..1_000 {
        match tier(&store, i) {
            Some(t) => {
                waiting += u64::from(t == Tier::Dram);
                assert_eq!(check(&store, 1, i, LEN), Some(true), "record {i}");
            }
            None => assert_eq!(check(&store, 1, i, LEN), None),
        }
    }
    assert_eq!(waiting, u.waiting_records);
}

#[test]
fn a_waiting_record_read_is_written_at_the_next_put_and_one_never_read_is_lost_to_a_crash() {
    let io = FaultIo::new();
    let (read, unread) = {
        let store = open_with(&io, admitting(100, 20));
        one_shot(&store, 1_000);
        let waiting: Vec<u64> = (0..1_000)
            .filter(|&i| tier(&store, i) == Some(Tier::Dram))
            .collect();
        assert!(waiting.len() >= 2, "{waiting:?}");
        let (read, unread) = (waiting[waiting.len() - 1], waiting[waiting.len() - 2]);
        assert_eq!(check(&store, 1, read, LEN), Some(true));
        put_range(&store, 1, 1_000, 1_001, LEN);
        assert_eq!(store.stats().admitted_records, 1);
        assert_eq!(tier(&store, read), Some(Tier::Ssd), "written once read");
        assert_eq!(tier(&store, unread), Some(Tier::Dram));
        store.sync().unwrap();
        (read, unread)
    };
    io.crash(Crash::DropUnsynced);
    let store = open_with(&io, admitting(100, 20));
    assert_eq!(check(&store, 1, read, LEN), Some(true));
    assert_eq!(
        check(&store, 1, unread, LEN),
        None,
        "it waited in DRAM only"
    );
    assert_eq!(store.stats().checksum_failures, 0);
}

#[test]
fn a_key_put_again_while_the_ghost_remembers_it_is_written() {
    let io = FaultIo::new();
    let store = open_with(&io, admitting(100, 20));
    // Note each key that waited when put.
    let mut waited = Vec::new();
    for i in 0..1_000 {
        put_range(&store, 1, i, i + 1, LEN);
        if tier(&store, i) == Some(Tier::Dram) {
            waited.push(i);
        }
    }
    // The newest that waited and has left the room since (the ghost still remembers it).
    let gone = *waited
        .iter()
        .rev()
        .find(|&&i| tier(&store, i).is_none())
        .unwrap();
    let held_before = store.stats().held_records;
    put_range(&store, 1, gone, gone + 1, LEN);
    assert_eq!(tier(&store, gone), Some(Tier::Ssd));
    assert_eq!(store.stats().held_records, held_before);
    assert_eq!(check(&store, 1, gone, LEN), Some(true));
}

#[test]
fn a_record_read_while_waiting_is_written_before_a_newer_put_and_never_once_retired() {
    let io = FaultIo::new();
    {
        let store = open_with(&io, admitting(100, 20));
        let (i, j) = two_waiting(&store);
        // `j` read, then put again with other bytes: the put writes `j` as read first, then
        // the new bytes, which stand.
        assert_eq!(check(&store, 1, j, LEN), Some(true));
        put_range(&store, 2, j, j + 1, LEN);
        assert_eq!(store.stats().admitted_records, 1);
        assert_eq!(tier(&store, j), Some(Tier::Ssd));
        assert_eq!(check(&store, 2, j, LEN), Some(true));
        // `i` read, then its namespace retired before the next put: the put writes nothing of
        // it.
        assert_eq!(check(&store, 1, i, LEN), Some(true));
        store.retire_namespace(NS).unwrap();
        put_range(&store, 1, 2_000, 2_001, LEN);
        assert_eq!(store.stats().admitted_records, 1);
        assert_eq!(check(&store, 1, i, LEN), None);
        assert_eq!(check(&store, 2, j, LEN), None);
        store.sync().unwrap();
        store.close().unwrap();
    }
    let store = open_with(&io, admitting(100, 20));
    for k in 0..1_000 {
        assert_eq!(check(&store, 1, k, LEN), None, "record {k} retired");
    }
}

#[test]
fn a_pin_reads_a_waiting_record_and_retirement_refuses_it() {
    let io = FaultIo::new();
    let store = open_with(&io, admitting(100, 20));
    let (i, j) = two_waiting(&store);
    let pin = store.pin(&key(i)).unwrap();
    // A pin is a read: the record is written at the next put; the pin keeps its bytes.
    put_range(&store, 1, 1_000, 1_001, LEN);
    assert_eq!(tier(&store, i), Some(Tier::Ssd));
    let mut out = Vec::new();
    assert!(store.get_pinned(pin, &mut out).unwrap().is_some());
    assert_eq!(out, payload(1, i, LEN));
    let mut part = vec![0u8; 100];
    assert!(store.read_pinned_into(pin, LEN, 50, &mut part).unwrap());
    assert_eq!(part, payload(1, i, LEN)[50..150]);
    let second = store.pin(&key(j)).unwrap();
    let lent = store.with_pinned(second, &mut Vec::new(), |b| b == payload(1, j, LEN));
    assert_eq!(lent.unwrap(), Some(true));
    store.retire_namespace(NS).unwrap();
    assert!(store.get_pinned(pin, &mut out).unwrap().is_none());
    assert!(store.get_pinned(second, &mut out).unwrap().is_none());
    assert_eq!(check(&store, 1, j, LEN), None);
    assert!(store.unpin(pin) && store.unpin(second));
}

#[test]
fn records_that_come_back_after_leaving_the_room_are_not_held_back() {
    // Each round puts 100 new records and reads the last round's 100, putting again those it
    // misses (an engine recomputes and publishes them): the tier holds 400, so writing every
    // record hits them all; a room of 40 would have let them go.
    let io = FaultIo::new();
    let store = open_with(&io, admitting(400, 40));
    let (rounds, each) = (60u64, 100u64);
    let mut hits = 0;
    for round in 0..rounds {
        put_range(&store, 1, round * each, (round + 1) * each, LEN);
        if round > 0 {
            for i in (round - 1) * each..round * each {
                match check(&store, 1, i, LEN) {
                    Some(exact) => {
                        assert!(exact, "record {i}");
                        hits += 1;
                    }
                    None => put_range(&store, 1, i, i + 1, LEN),
                }
            }
        }
    }
    let s = store.stats();
    assert!(s.held_records < rounds * each / 20, "{s:?}");
    assert!(hits > (rounds - 1) * each * 9 / 10, "{hits} hits, {s:?}");
}

#[test]
fn put_frames_holds_back_as_put_does_and_keeps_the_frames_it_holds() {
    let io = FaultIo::new();
    let mut c = admitting(100, 20);
    c.durability = Durability::Group;
    let store = open_with(&io, c);
    let mut held = 0;
    for from in (0..1_000).step_by(4) {
        let mut bundle: Vec<(RecordMeta, FrameBuf)> = (from..from + 4)
            .map(|i| {
                let mut f = store.frame_buf();
                let a = store.frame_alignment();
                f.begin(a, LEN).extend_from_slice(&payload(1, i, LEN));
                f.finish(a).unwrap();
                (meta(i), f)
            })
            .collect();
        let put = store.put_frames(&mut bundle, None).unwrap();
        store.sync().unwrap();
        assert!(bundle.is_empty());
        assert_eq!((put.memory.len(), put.held.len()), (4, 4));
        assert_eq!(put.receipt.held, put.held.iter().filter(|h| **h).count());
        // Durable says only what was written: under Group nothing is before its sync.
        assert_eq!(put.receipt.durable, put.receipt.held == 4);
        for (i, h) in (from..from + 4).zip(&put.held) {
            if *h {
                held += 1;
                assert_eq!(tier(&store, i), Some(Tier::Dram), "record {i}");
                assert_eq!(check(&store, 1, i, LEN), Some(true), "record {i}");
            }
        }
        for (m, h) in put.memory.iter().zip(&put.held) {
            assert!(!h || m.is_none(), "the room keeps a held frame");
        }
    }
    assert!(held > 500, "{held}");
    assert_eq!(store.stats().held_records, held);
}
