//! The `lru` policy: records leave one at a time, least recently used first and a chain from
//! its end; each is punched out of its sealed segment, and stays gone after a crash; fsck calls
//! a punched record punched, not damaged; pins hold a record; a file system without holes
//! still keeps the budget.

mod common;

use common::*;
use orbitkv_segments::Alignment;
use orbitkv_store::io::fault::{Crash, FaultIo, FaultPlan};
use orbitkv_store::io::{Io, OpenMode};
use orbitkv_store::{Durability, Policy, StateStore, StoreConfig, fsck, ssd_bytes_holding};

const LEN: usize = 16 << 10;
const RECORDS: u64 = 200;

fn lru_config() -> StoreConfig {
    let mut c = StoreConfig::new("data");
    c.durability = Durability::Manual;
    c.ssd_bytes = Some(ssd_bytes_holding(RECORDS, LEN as u64, Alignment::Direct));
    c.policy = Policy::RecordLru;
    c
}

fn present(store: &StateStore, to: u64) -> Vec<u64> {
    (0..to)
        .filter(|&i| store.index().contains(&key(i)))
        .collect()
}

#[test]
fn punched_records_stay_gone_after_a_close_or_a_crash_and_fsck_calls_them_punched() {
    for closed in [true, false] {
        let io = FaultIo::new();
        let kept = {
            let store = open_with(&io, lru_config());
            put_range(&store, 1, 0, 3 * RECORDS, LEN);
            store.sync().unwrap();
            let s = store.stats();
            assert!(s.punched_records > 0, "{s:?}");
            let kept = present(&store, 3 * RECORDS);
            assert!(kept.len() as u64 >= RECORDS, "{} held", kept.len());
            if closed {
                store.close().unwrap();
            }
            kept
        };
        io.crash(Crash::DropUnsynced);
        {
            let store = open_with(&io, lru_config());
            let after = present(&store, 3 * RECORDS);
            if closed {
                // A close makes the punches durable: the same records, the rest punched.
                assert!(store.recovery_report().punched > 0);
                assert_eq!(after, kept, "the same records after a close");
            } else {
                // Punches not yet synced may be lost: their records come back whole.
                assert!(
                    kept.iter().all(|i| after.contains(i)),
                    "a kept record was lost"
                );
            }
            for i in after {
                assert_eq!(check(&store, 1, i, LEN), Some(true), "record {i}");
            }
            assert_eq!(store.stats().checksum_failures, 0);
        }
        let report = fsck::check(&io, std::path::Path::new("data"), &|_, _| {}).unwrap();
        assert!(report.is_clean(), "{:?}", report.problems());
        let punched: u64 = report.segments.iter().map(|s| s.punched).sum();
        assert!(!closed || punched > 0);
    }
}

#[test]
fn a_chain_leaves_from_its_end() {
    let io = FaultIo::new();
    let store = open_with(&io, lru_config());
    // One request's chain of eight blocks, then other traffic pushing it out.
    let chain: Vec<Vec<u8>> = (0..8).map(|i| payload(2, i, LEN)).collect();
    let bundle: Vec<_> = chain
        .iter()
        .enumerate()
        .map(|(i, p)| (meta(i as u64), p.as_slice()))
        .collect();
    store.put(&bundle).unwrap();
    let mut lengths = Vec::new();
    for i in 1_000..1_000 + 2 * RECORDS {
        let p = payload(2, i, LEN);
        store.put(&[(meta(i), p.as_slice())]).unwrap();
        let held = present(&store, 8);
        // Always a prefix of the chain: its start is never lost while its end is kept.
        assert_eq!(held, (0..held.len() as u64).collect::<Vec<_>>());
        lengths.push(held.len());
    }
    assert_eq!(lengths.first(), Some(&8));
    assert_eq!(lengths.last(), Some(&0));
}

#[test]
fn a_pinned_record_is_not_punched_while_pinned() {
    let io = FaultIo::new();
    let store = open_with(&io, lru_config());
    put_range(&store, 3, 0, 40, LEN);
    store.sync().unwrap();
    let pin = store.pin(&key(0)).unwrap();
    put_range(&store, 3, 40, 3 * RECORDS, LEN);
    let mut out = Vec::new();
    assert!(store.get_pinned(pin, &mut out).unwrap().is_some());
    assert_eq!(out, payload(3, 0, LEN));
    // Its segment's records stay indexed while the pin lasts.
    assert_eq!(check(&store, 3, 1, LEN), Some(true));
    assert!(store.unpin(pin));
    put_range(&store, 3, 3 * RECORDS, 4 * RECORDS, LEN);
    assert_eq!(
        check(&store, 3, 0, LEN),
        None,
        "gone once unpinned and oldest"
    );
}

#[test]
fn without_holes_records_still_go_within_the_budget() {
    let io = FaultIo::new();
    let store = open_with(&io, lru_config());
    io.set_plan(FaultPlan {
        refuse_punches: Some(std::io::ErrorKind::Unsupported),
        ..FaultPlan::default()
    });
    let budget = lru_config().ssd_bytes.unwrap();
    for i in 0..4 * RECORDS {
        let p = payload(4, i, LEN);
        store.put(&[(meta(i), p.as_slice())]).unwrap();
        assert!(store.usage().ssd_used <= budget);
    }
    let s = store.stats();
    assert_eq!(s.failed_punches, 1, "tried once: {s:?}");
    assert!(s.reclaimed_segments > 0 && s.punched_records == 0, "{s:?}");
    let kept = present(&store, 4 * RECORDS);
    // Whole segments go: fewer records held, every one right.
    assert!(kept.len() as u64 > RECORDS / 2, "{} held", kept.len());
    for i in kept {
        assert_eq!(check(&store, 4, i, LEN), Some(true));
    }
}

#[test]
fn on_real_files_punched_records_are_holes_and_stay_gone() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    std::fs::create_dir_all(&dir).unwrap();
    let (io, _) = default_backend(&dir);
    let mut c = lru_config();
    c.data_dir = dir.clone();
    let kept = {
        let store = StateStore::open(io.clone(), c.clone()).unwrap();
        store.register_namespace(NS, info()).unwrap();
        put_range(&store, 5, 0, 3 * RECORDS, LEN);
        store.sync().unwrap();
        let kept = present(&store, 3 * RECORDS);
        let s = store.stats();
        if s.failed_punches > 0 {
            // A file system without holes (the other test covers it).
            eprintln!("no holes here: {s:?}");
            return;
        }
        assert!(s.punched_records > 0, "{s:?}");
        store.close().unwrap();
        kept
    };
    // What the file system allocates is what the store counted: within the budget.
    let allocated: u64 = std::fs::read_dir(dir.join("segments"))
        .unwrap()
        .map(|e| {
            use std::os::unix::fs::MetadataExt;
            e.unwrap().metadata().unwrap().blocks() * 512
        })
        .sum();
    assert!(
        allocated <= c.ssd_bytes.unwrap(),
        "{allocated} bytes allocated"
    );
    let store = StateStore::open(io, c).unwrap();
    assert!(store.recovery_report().punched > 0);
    assert_eq!(present(&store, 3 * RECORDS), kept);
    for &i in &kept {
        assert_eq!(check(&store, 5, i, LEN), Some(true), "record {i}");
    }
    drop(store);
    let report = fsck::check(
        orbitkv_store::io::offline_backend().as_ref(),
        &dir,
        &|_, _| {},
    )
    .unwrap();
    assert!(report.is_clean(), "{:?}", report.problems());
}

#[test]
fn punched_records_do_not_make_a_segment_look_sparse_to_compaction() {
    let io = FaultIo::new();
    let store = open_with(&io, lru_config());
    put_range(&store, 6, 0, 3 * RECORDS, LEN);
    store.sync().unwrap();
    assert!(store.stats().punched_records > 0);
    // Every record not punched out is live: nothing to gain by rewriting.
    for s in store.segment_stats().unwrap() {
        assert_eq!(s.live_fraction(), 1.0, "{s:?}");
    }
    assert!(store.compact_below(0.5).unwrap().inputs.is_empty());
}

#[test]
fn a_record_evicted_whole_keeps_a_newer_one_of_its_key_after_a_crash() {
    // A failed punch leaves an evicted record whole, as a pin taken during its eviction does.
    let io = FaultIo::new();
    {
        let store = open_with(&io, lru_config());
        let old = payload(7, 0, LEN);
        store.put(&[(meta(0), old.as_slice())]).unwrap();
        put_range(&store, 7, 1, 40, LEN);
        // Its punch fails as it is evicted: it leaves the index, its bytes stay whole.
        io.set_plan(FaultPlan {
            refuse_punches: Some(std::io::ErrorKind::Other),
            ..FaultPlan::default()
        });
        put_range(&store, 7, 40, 3 * RECORDS, LEN);
        assert!(!store.index().contains(&key(0)));
        io.set_plan(FaultPlan::default());
        // The key put again, then pushed out by later traffic.
        let new = payload(8, 0, LEN);
        store.put(&[(meta(0), new.as_slice())]).unwrap();
        put_range(&store, 7, 3 * RECORDS, 6 * RECORDS, LEN);
        store.sync().unwrap();
        assert!(store.stats().punched_records > 0);
        drop(store);
    }
    io.crash(Crash::DropUnsynced);
    let store = open_with(&io, lru_config());
    let mut out = Vec::new();
    if store.get(&key(0), &mut out).unwrap().is_some() {
        assert_eq!(out, payload(8, 0, LEN), "the older version came back");
    }
}

#[test]
fn a_punched_records_sequence_is_never_given_out_again() {
    let io = FaultIo::new();
    let (seq, path, at) = {
        let store = open_with(&io, lru_config());
        put_range(&store, 9, 0, 3, LEN);
        let r = store.index().get(&key(2)).unwrap();
        let path = std::path::Path::new("data/segments").join(format!("{:08x}.seg", r.segment));
        store.close().unwrap();
        (r.sequence, path, r.offset)
    };
    // The newest record punched out, as an eviction would.
    let file = io.open(&path, OpenMode::ReadWrite).unwrap();
    file.punch_hole(at, LEN as u64 + 4096).unwrap();
    drop(file);
    let store = open_with(&io, lru_config());
    assert_eq!(store.recovery_report().punched, 1);
    assert_eq!(check(&store, 9, 2, LEN), None);
    let p = payload(9, 3, LEN);
    let receipt = store.put(&[(meta(3), p.as_slice())]).unwrap();
    assert!(
        receipt.first_sequence > seq,
        "{} after {seq}",
        receipt.first_sequence
    );
}
