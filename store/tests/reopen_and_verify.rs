//! Records survive a restart; opening reads only footers of sealed segments (≤ 1 % of stored
//! payload bytes for payloads ≥ 64 KiB); reads are verified and damage is a miss; the directory
//! is locked; an incompatible store is refused with instructions.

mod common;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::*;
use orbitkv_segments::Alignment;
use orbitkv_store::io::fault::{FaultIo, FaultPlan};
use orbitkv_store::io::std_io::StdIo;
use orbitkv_store::io::{Io, OpenMode};
use orbitkv_store::{Durability, Error, StateStore, StoreConfig};

#[test]
fn records_survive_restart_and_open_reads_only_footers() {
    let io = FaultIo::new();
    let len = 64 << 10;
    {
        let store = open(&io, 4 << 20, Durability::EveryPut);
        put_range(&store, 7, 0, 300, len);
        assert!(store.segments().len() > 4, "several sealed segments");
        for i in 0..300 {
            assert_eq!(check(&store, 7, i, len), Some(true));
        }
        assert_eq!(store.probe(&(0..310).map(key).collect::<Vec<_>>()), 300);
        store.close().unwrap();
    }
    let store = open(&io, 4 << 20, Durability::EveryPut);
    let r = store.recovery_report().clone();
    assert!(r.quarantined.is_empty() && r.corrupt_records.is_empty() && r.torn_tails.is_empty());
    assert_eq!(r.indexed, 300);
    for i in 0..300 {
        assert_eq!(check(&store, 7, i, len), Some(true), "record {i}");
    }
    // Closed cleanly: every segment is sealed, so open read only the manifest and the tails.
    let s = store.stats();
    assert!(
        s.open_bytes_read * 100 <= s.open_payload_bytes,
        "open read {} bytes for {} payload bytes",
        s.open_bytes_read,
        s.open_payload_bytes
    );
}

#[test]
fn a_damaged_record_is_a_miss_and_leaves_the_index() {
    let io = FaultIo::new();
    let store = open(&io, 64 << 20, Durability::EveryPut);
    put_range(&store, 1, 0, 10, 1000);
    let rec = store.index().get(&key(4)).unwrap();
    let path = Path::new("data/segments").join(format!("{:08x}.seg", rec.segment));
    let mut bytes = io.read_file(&path).unwrap();
    bytes[rec.offset as usize + 256 + 500] ^= 0x20;
    io.write_file(&path, &bytes);
    assert_eq!(check(&store, 1, 4, 1000), None);
    assert_eq!(store.stats().checksum_failures, 1);
    assert!(store.index().get(&key(4)).is_none());
    for i in (0..10).filter(|&i| i != 4) {
        assert_eq!(check(&store, 1, i, 1000), Some(true));
    }
}

#[test]
fn a_read_error_quarantines_the_segment_and_reads_continue() {
    let io = FaultIo::new();
    let store = open(&io, 64 << 20, Durability::EveryPut);
    put_range(&store, 1, 0, 5, 100);
    io.set_plan(FaultPlan {
        fail_reads_of: Some(".seg".into()),
        ..Default::default()
    });
    assert_eq!(check(&store, 1, 0, 100), None);
    let s = store.stats();
    assert_eq!((s.read_errors, s.quarantined_segments), (1, 1));
    io.set_plan(FaultPlan::default());
    // Quarantined: its records stay misses, no wrong bytes.
    assert_eq!(check(&store, 1, 1, 100), None);
}

#[test]
fn the_data_directory_is_locked_and_released() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = StoreConfig::new(dir.path().join("d"));
    let io: Arc<dyn Io> = Arc::new(StdIo);
    let a = StateStore::open(io.clone(), cfg.clone()).unwrap();
    assert!(matches!(
        StateStore::open(io.clone(), cfg.clone()),
        Err(Error::Locked { .. })
    ));
    drop(a);
    let b = StateStore::open(io, cfg).unwrap();
    b.close().unwrap();
}

#[test]
fn an_incompatible_store_is_refused_with_instructions() {
    let io = FaultIo::new();
    drop(open(&io, 1 << 20, Durability::EveryPut));
    let path = Path::new("data/orbitkv.dir");
    let mut h = io.read_file(path).unwrap();
    h[8..12].copy_from_slice(&2u32.to_le_bytes());
    let crc = crc32c_of(&h[..60]);
    h[60..64].copy_from_slice(&crc.to_le_bytes());
    io.write_file(path, &h);
    let io: Arc<dyn Io> = Arc::new(io);
    let err = StateStore::open(io, config(1 << 20, Durability::EveryPut))
        .err()
        .unwrap();
    assert!(matches!(
        err,
        Error::IncompatibleStore {
            found: 2,
            supported: 1,
            ..
        }
    ));
    assert!(err.to_string().contains("--discard-incompatible"), "{err}");
}

#[test]
fn puts_need_a_registered_namespace() {
    let io = FaultIo::new();
    let store = open(&io, 1 << 20, Durability::EveryPut);
    let other = orbitkv_state::Namespace([0x99; 32]);
    let p = vec![0u8; 10];
    assert!(matches!(
        store.put(&[(meta_in(other, 1), p.as_slice())]),
        Err(Error::UnknownNamespace(_))
    ));
}

#[test]
fn std_io_round_trip_on_a_real_directory() {
    let dir = tempfile::tempdir().unwrap();
    let io: Arc<dyn Io> = Arc::new(StdIo);
    let mut cfg = StoreConfig::new(dir.path().join("d"));
    cfg.segment_bytes = 1 << 20;
    {
        let store = StateStore::open(io.clone(), cfg.clone()).unwrap();
        store.register_namespace(NS, info()).unwrap();
        put_range(&store, 3, 0, 40, 50_000);
    }
    let store = StateStore::open(io.clone(), cfg).unwrap();
    for i in 0..40 {
        assert_eq!(check(&store, 3, i, 50_000), Some(true));
    }
    let f = io
        .open(&dir.path().join("d/orbitkv.dir"), OpenMode::Read)
        .unwrap();
    assert_eq!(f.size().unwrap(), 64);
}

#[test]
fn direct_io_round_trip_with_aligned_frames_on_a_real_directory() {
    let dir = tempfile::tempdir().unwrap();
    let Some(direct) = direct_or_skip(dir.path()) else {
        return;
    };
    // Large frames are read in chunks through io_uring where the kernel gives one.
    uring_or_skip("chunked direct reads");
    let io: Arc<dyn Io> = Arc::new(direct);
    let mut cfg = StoreConfig::new(dir.path().join("d"));
    cfg.segment_bytes = 4 << 20;
    cfg.alignment = Alignment::Direct;
    // Small frames, and every seventh over a MiB (read in chunks, several in flight).
    let sizes = |i: u64| {
        if i % 7 == 3 {
            (1 << 20) + (i as usize * 7919) % 900_000
        } else {
            1 + (i as usize * 7919) % 70_000
        }
    };
    {
        let store = StateStore::open(io.clone(), cfg.clone()).unwrap();
        store.register_namespace(NS, info()).unwrap();
        for i in 0..60 {
            let p = payload(4, i, sizes(i));
            store.put(&[(meta(i), p.as_slice())]).unwrap();
            // Read back at once: from the active segment, through the direct descriptor.
            let mut out = Vec::new();
            store.get(&key(i), &mut out).unwrap().unwrap();
            assert!(out == p);
        }
    }
    // Reopened: the active segment is scanned (buffered) and sealed, frames read direct.
    let store = StateStore::open(io.clone(), cfg.clone()).unwrap();
    for i in 0..60 {
        assert_eq!(check(&store, 4, i, sizes(i)), Some(true), "record {i}");
        let r = store.index().get(&key(i)).unwrap();
        assert_eq!(
            r.offset % 4096,
            0,
            "frames of a direct segment are 4 KiB-aligned"
        );
    }
    // The active segment holds blocks for a whole segment; sealed ones only what they use.
    let seg_dir = dir.path().join("d/segments");
    let allocated = |p: &Path| {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(p).unwrap();
        (m.len(), m.blocks() * 512)
    };
    let active = store.segments().into_iter().find(|(_, sealed)| !sealed);
    if let Some((id, _)) = active {
        let (len, blocks) = allocated(&seg_dir.join(format!("{id:08x}.seg")));
        assert!(
            blocks >= 1 << 20 && len < 1 << 20,
            "preallocated: {len} bytes, {blocks} allocated"
        );
    }
    store.close().unwrap();
    for e in std::fs::read_dir(&seg_dir).unwrap() {
        let (len, blocks) = allocated(&e.unwrap().path());
        assert!(
            blocks <= len.next_multiple_of(4096) + (64 << 10),
            "{len} bytes, {blocks} allocated"
        );
    }
    let report = orbitkv_store::fsck::check(&StdIo, &dir.path().join("d"), &|_, _| {}).unwrap();
    assert!(report.is_clean(), "{:?}", report.problems());
}

fn crc32c_of(b: &[u8]) -> u32 {
    orbitkv_segments::crc::crc32c(b)
}

#[test]
fn a_corrupt_record_in_the_active_segment_keeps_the_records_after_it() {
    let io = FaultIo::new();
    let store = open(&io, 64 << 20, Durability::EveryPut);
    put_range(&store, 2, 0, 6, 700);
    let rec = store.index().get(&key(2)).unwrap();
    drop(store); // still active: recovery scans it
    let path = Path::new("data/segments").join(format!("{:08x}.seg", rec.segment));
    let mut bytes = io.read_file(&path).unwrap();
    bytes[rec.offset as usize + 300] ^= 1;
    io.write_file(&path, &bytes);
    let store = open(&io, 64 << 20, Durability::EveryPut);
    assert_eq!(store.recovery_report().corrupt_records.len(), 1);
    assert_eq!(check(&store, 2, 2, 700), None);
    for i in [0, 1, 3, 4, 5] {
        assert_eq!(
            check(&store, 2, i, 700),
            Some(true),
            "record {i} after the corrupt one"
        );
    }
}

#[test]
fn a_sealed_segment_with_a_bad_footer_is_quarantined_and_the_rest_served() {
    let io = FaultIo::new();
    let store = open(&io, 8 << 10, Durability::EveryPut);
    put_range(&store, 4, 0, 6, 3000);
    let rec = store.index().get(&key(0)).unwrap();
    store.close().unwrap();
    let path = Path::new("data/segments").join(format!("{:08x}.seg", rec.segment));
    let mut bytes = io.read_file(&path).unwrap();
    let n = bytes.len();
    bytes[n - 100] ^= 1; // inside the footer
    io.write_file(&path, &bytes);
    let store = open(&io, 8 << 10, Durability::EveryPut);
    assert_eq!(store.recovery_report().quarantined.len(), 1);
    assert_eq!(check(&store, 4, 0, 3000), None);
    let served = (1..6)
        .filter(|&i| check(&store, 4, i, 3000) == Some(true))
        .count();
    assert!(
        served >= 4,
        "records in the other segments are served ({served})"
    );
}

#[test]
fn concurrent_puts_and_gets_never_return_wrong_bytes() {
    let io = FaultIo::new();
    let store = Arc::new(open(&io, 256 << 10, Durability::Manual));
    // The writer puts half, then waits for a read of one (up to 10 s) before the rest: reads
    // overlap writes however the threads are scheduled.
    let seen = Arc::new(AtomicBool::new(false));
    let writer = {
        let (store, seen) = (store.clone(), seen.clone());
        std::thread::spawn(move || {
            put_range(&store, 9, 0, 200, 2000);
            let deadline = Instant::now() + Duration::from_secs(10);
            while !seen.load(Ordering::Acquire) && Instant::now() < deadline {
                std::thread::yield_now();
            }
            put_range(&store, 9, 200, 400, 2000);
        })
    };
    let mut hits = 0;
    while !writer.is_finished() {
        for i in 0..400 {
            match check(&store, 9, i, 2000) {
                Some(true) => {
                    hits += 1;
                    seen.store(true, Ordering::Release);
                }
                Some(false) => panic!("record {i} read with different bytes"),
                None => {}
            }
        }
    }
    writer.join().unwrap();
    assert!(hits > 0);
    for i in 0..400 {
        assert_eq!(check(&store, 9, i, 2000), Some(true));
    }
}
