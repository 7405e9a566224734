//! Readers racing writers (inserts, replacements, removals, table rebuilds) never see a torn
//! entry, an entry of another key, or a sequence going backwards, and never touch reclaimed
//! memory. Every record's fields are a function of its key and sequence, so any mix is visible.

#![expect(
    clippy::unwrap_used,
    reason = "test code: a failed unwrap is a failed test"
)]

use orbitkv_testkit::Xorshift;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use orbitkv_index::{Index, Record, Tier};
use orbitkv_state::{
    CacheGroupId, Component, FormatDigest, HashDomain, Namespace, RankSpec, StateKey, TokenRange,
};

const KEYS: u64 = 4096;

fn key(i: u64) -> StateKey {
    let mut native = [0u8; 32];
    let h = i.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    native[..8].copy_from_slice(&h.to_le_bytes());
    native[8..16].copy_from_slice(&h.rotate_left(23).to_le_bytes());
    native[16..24].copy_from_slice(&i.to_le_bytes());
    StateKey::new(
        Namespace([9; 32]),
        HashDomain::SglangSha256,
        &native,
        CacheGroupId(0),
        Component::DenseKv,
        RankSpec::Rank(0),
    )
    .unwrap()
}

fn record(i: u64, seq: u64) -> Record {
    Record {
        tier: if seq.is_multiple_of(3) {
            Tier::Dram
        } else {
            Tier::Ssd
        },
        segment: (seq as u32) ^ (i as u32),
        offset: (seq % 1_000_000) * 8,
        stored_len: (seq as u32).wrapping_mul(2654435761) ^ (i as u32),
        range: TokenRange::new(i * 16, i * 16 + 16).unwrap(),
        sequence: seq,
        format: FormatDigest([1; 32]),
    }
}

fn consistent(i: u64, r: &Record) -> bool {
    *r == record(i, r.sequence)
}

#[test]
fn readers_never_see_torn_or_foreign_entries() {
    let index = Arc::new(Index::new()); // starts tiny: rebuilds happen under readers
    let seq = Arc::new(AtomicU64::new(1));
    let stop = Arc::new(AtomicBool::new(false));
    let deadline = Instant::now() + Duration::from_millis(1500);
    let mut handles = Vec::new();
    for w in 0..2u64 {
        let (index, seq, stop) = (index.clone(), seq.clone(), stop.clone());
        handles.push(std::thread::spawn(move || {
            let mut rng = Xorshift::new(0x1234_5678u64 ^ w);
            let mut ops = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let x = rng.next_u64();
                // Each writer owns half the keys, so one key's operations are ordered in one
                // thread: its sequence only moves forward, even across a removal.
                let i = (x % (KEYS / 2)) * 2 + w;
                if x.is_multiple_of(11) {
                    index.remove(&key(i), None);
                } else {
                    let s = seq.fetch_add(1, Ordering::Relaxed);
                    index.insert(&key(i), record(i, s)).unwrap();
                }
                ops += 1;
            }
            ops
        }));
    }
    let mut readers = Vec::new();
    for r in 0..2u64 {
        let (index, stop) = (index.clone(), stop.clone());
        readers.push(std::thread::spawn(move || {
            let mut last = vec![0u64; KEYS as usize];
            let mut rng = Xorshift::new(0x9876_5432u64 ^ r);
            let mut seen = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let i = rng.below(KEYS);
                if let Some(rec) = index.get(&key(i)) {
                    assert!(
                        consistent(i, &rec),
                        "torn or foreign entry for key {i}: {rec:?}"
                    );
                    // A key's sequences are issued in order by its one writer; a removal then
                    // re-insert only moves forward, so a reader never sees a key go back in time.
                    assert!(rec.sequence >= last[i as usize], "sequence went backwards");
                    last[i as usize] = rec.sequence;
                    seen += 1;
                }
                let chain: Vec<StateKey> = (i..(i + 4).min(KEYS)).map(key).collect();
                assert!(index.probe(&chain) <= chain.len());
            }
            seen
        }));
    }
    while Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    stop.store(true, Ordering::Relaxed);
    let writes: u64 = handles.into_iter().map(|h| h.join().unwrap()).sum();
    let reads: u64 = readers.into_iter().map(|h| h.join().unwrap()).sum();
    assert!(
        writes > 10_000 && reads > 10_000,
        "writes {writes}, reads {reads}"
    );
    // After the race, every key's record is still self-consistent.
    for i in 0..KEYS {
        if let Some(r) = index.get(&key(i)) {
            assert!(consistent(i, &r));
        }
    }
}
