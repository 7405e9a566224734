//! The SSD tier's budget: segment files never outgrow it, whole segments are reclaimed by the
//! policy, records read are copied forward (S3-FIFO, FIFO with reinsertion) while unread ones
//! go, a reclaimed record never comes back after a restart, and nothing wrong is ever served.

mod common;

use std::sync::Arc;

use common::*;
use orbitkv_segments::Alignment;
use orbitkv_store::io::fault::FaultIo;
use orbitkv_store::io::{Io, OpenMode};
use orbitkv_store::{Durability, Error, Policy, StateStore, StoreConfig, ssd_bytes_holding};

const LEN: usize = 4096;
const BUDGET: u64 = 1 << 20;

fn open_bounded(io: &FaultIo, policy: Policy) -> StateStore {
    let mut c = StoreConfig::new("data");
    c.durability = Durability::Manual;
    c.ssd_bytes = Some(BUDGET);
    c.policy = policy;
    open_with(io, c)
}

/// Bytes the segment files take on disk: their lengths, less their holes.
fn disk_bytes(io: &FaultIo) -> u64 {
    let dir = std::path::Path::new("data/segments");
    io.list_dir(dir)
        .unwrap_or_default()
        .iter()
        .map(|n| {
            let path = dir.join(n);
            let len = io.read_file(&path).map_or(0, |b| b.len() as u64);
            let holes: u64 = io
                .open(&path, OpenMode::Read)
                .and_then(|f| f.holes())
                .unwrap_or_default()
                .iter()
                .map(|(a, b)| b - a)
                .sum();
            len - holes
        })
        .sum()
}

#[test]
fn segments_stay_within_the_budget_under_every_policy() {
    for (name, policy) in Policy::ALL {
        let io = FaultIo::new();
        let store = open_bounded(&io, policy);
        for i in 0..2_000u64 {
            let p = payload(1, i, LEN);
            store.put(&[(meta(i), p.as_slice())]).unwrap();
            let used = store.usage().ssd_used;
            assert!(used <= BUDGET, "{name}: {used} bytes used after put {i}");
        }
        store.sync().unwrap();
        assert!(
            disk_bytes(&io) <= BUDGET,
            "{name}: files outgrew the budget"
        );
        let s = store.stats();
        assert!(
            s.reclaimed_segments > 0 && s.evicted_records > 0,
            "{name}: {s:?}"
        );
        let mut found = 0;
        for i in 0..2_000u64 {
            match check(&store, 1, i, LEN) {
                Some(true) => found += 1,
                Some(false) => panic!("{name}: record {i} served different bytes"),
                None => {}
            }
        }
        // 8 MB written into 1 MiB: the newest records are what remains.
        assert!(found > 100 && found < 256, "{name}: {found} records remain");
        assert_eq!(check(&store, 1, 1_999, LEN), Some(true), "{name}");
        assert_eq!(check(&store, 1, 0, LEN), None, "{name}");
    }
}

#[test]
fn a_budget_for_n_records_holds_n_on_average() {
    for (records, len) in [
        (300u64, 4096usize),
        (2_000, 512),
        (120, 16 << 10),
        (900, 16 << 10),
    ] {
        for (name, policy) in Policy::ALL {
            let io = FaultIo::new();
            let mut c = StoreConfig::new("data");
            c.durability = Durability::Manual;
            // Under lru the store writes direct frames, whose pages a punch frees.
            let alignment = match policy {
                Policy::RecordLru => Alignment::Direct,
                _ => Alignment::Packed,
            };
            c.ssd_bytes = Some(ssd_bytes_holding(records, len as u64, alignment));
            c.policy = policy;
            let store = open_with(&io, c);
            let (mut sum, mut samples, mut low, mut high) = (0u64, 0u64, u64::MAX, 0u64);
            for i in 0..12 * records {
                let p = payload(4, i, len);
                store.put(&[(meta(i), p.as_slice())]).unwrap();
                if i >= 4 * records {
                    let held = store.index().len() as u64;
                    sum += held;
                    samples += 1;
                    low = low.min(held);
                    high = high.max(held);
                }
            }
            let mean = sum as f64 / samples as f64;
            let n = records as f64;
            eprintln!("{name}, {records} x {len} B: holds {mean:.1} on average ({low}..={high})");
            if policy == Policy::RecordLru {
                // Records go one at a time: no half-free segment on average, and no segment
                // made room for before it fills, so it holds at least as many at all times.
                assert!(
                    low >= records,
                    "{name}, {records} x {len} B: holds {mean:.1} on average ({low}..={high})"
                );
            } else {
                // Within 1.5%, or a few records where segments hold only a few each.
                assert!(
                    mean >= 0.985 * n && mean <= 1.015 * n + 8.0,
                    "{name}, {records} x {len} B: holds {mean:.1} on average ({low}..={high})"
                );
            }
        }
    }
}

#[test]
fn records_read_are_kept_and_unread_ones_go() {
    for (name, policy) in Policy::ALL {
        let io = FaultIo::new();
        let store = open_bounded(&io, policy);
        let hot: Vec<u64> = (0..20).collect();
        for i in 0..3_000u64 {
            let p = payload(2, i, LEN);
            store.put(&[(meta(i), p.as_slice())]).unwrap();
            if i >= 20 && i % 10 == 0 {
                for &h in &hot {
                    assert_ne!(check(&store, 2, h, LEN), Some(false), "{name}");
                }
            }
        }
        let kept = hot
            .iter()
            .filter(|&&h| check(&store, 2, h, LEN) == Some(true))
            .count();
        if policy == Policy::Fifo {
            assert_eq!(kept, 0, "fifo drops whole segments, read or not");
            assert_eq!(store.stats().reinserted_records, 0);
        } else if policy == Policy::RecordLru {
            assert_eq!(kept, hot.len(), "lru keeps records used every round");
            let s = store.stats();
            assert!(s.punched_records > 0 && s.evicted_records > 0, "{s:?}");
        } else {
            assert_eq!(kept, hot.len(), "{name}: records read every round stay");
            assert!(store.stats().reinserted_records > 0);
        }
    }
}

#[test]
fn a_reclaimed_record_does_not_come_back_after_a_restart() {
    let io = FaultIo::new();
    let (present, gone): (Vec<u64>, Vec<u64>) = {
        let store = open_bounded(&io, Policy::S3Fifo);
        for i in 0..1_500u64 {
            let p = payload(3, i, LEN);
            store.put(&[(meta(i), p.as_slice())]).unwrap();
        }
        store.sync().unwrap();
        let all: Vec<u64> = (0..1_500).collect();
        let present = all
            .iter()
            .copied()
            .filter(|&i| store.index().contains(&key(i)))
            .collect();
        let gone = all
            .iter()
            .copied()
            .filter(|&i| !store.index().contains(&key(i)))
            .collect();
        drop(store); // no close: the active segments are scanned on open
        (present, gone)
    };
    let store = open_bounded(&io, Policy::S3Fifo);
    for &i in &present {
        assert_eq!(check(&store, 3, i, LEN), Some(true), "record {i} survives");
    }
    for &i in &gone {
        assert_eq!(
            check(&store, 3, i, LEN),
            None,
            "reclaimed record {i} stays gone"
        );
    }
    assert!(store.usage().ssd_used <= BUDGET);
}

#[test]
fn a_full_tier_of_pinned_segments_refuses_puts_until_unpinned() {
    let io = FaultIo::new();
    let store = open_bounded(&io, Policy::Fifo);
    let mut pins = Vec::new();
    let mut i = 0u64;
    let err = loop {
        let p = payload(4, i, LEN);
        match store.put(&[(meta(i), p.as_slice())]) {
            Ok(_) => {}
            Err(e) => break e,
        }
        pins.push(store.pin(&key(i)).unwrap());
        i += 1;
        assert!(i < 1_000, "the budget holds far fewer");
    };
    assert!(matches!(err, Error::CapacityExhausted { .. }), "{err}");
    assert!(err.to_string().contains("release pins"), "{err}");
    let s = store.stats();
    assert_eq!((s.capacity_refusals, s.refused_puts), (1, 1));
    // Reads go on; every pinned record is served.
    for (j, pin) in pins.iter().enumerate() {
        let mut out = Vec::new();
        assert!(store.get_pinned(*pin, &mut out).unwrap().is_some());
        assert_eq!(out, payload(4, j as u64, LEN));
    }
    for pin in pins {
        assert!(store.unpin(pin));
    }
    let p = payload(4, i, LEN);
    store.put(&[(meta(i), p.as_slice())]).unwrap();
    assert_eq!(check(&store, 4, i, LEN), Some(true));
}

#[test]
fn a_budget_below_the_minimum_is_refused() {
    let mut c = StoreConfig::new("data");
    c.ssd_bytes = Some(4096);
    let io: Arc<dyn Io> = Arc::new(FaultIo::new());
    let err = StateStore::open(io, c).err().unwrap();
    assert!(matches!(err, Error::BadConfig(_)), "{err}");
}
