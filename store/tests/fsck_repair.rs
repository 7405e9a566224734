//! `fsck` finds every kind of damage without changing anything, and `repair` fixes what can be
//! fixed in place — torn tails, bad records, unreadable footers (their frames are salvaged),
//! orphan files — after which the store checks clean and every undamaged record is exact.

#![expect(
    clippy::unwrap_used,
    reason = "test code: a failed unwrap is a failed test"
)]

mod common;

use std::path::Path;
use std::sync::Arc;

use common::*;
use orbitkv_store::fsck::{check, discard_incompatible, repair};
use orbitkv_store::io::fault::{Crash, FaultIo};
use orbitkv_store::io::{Io, OpenMode};
use orbitkv_store::{Durability, Error, StateStore};

const SEG: u64 = 12 << 10;

fn fsck(io: &FaultIo) -> orbitkv_store::fsck::FsckReport {
    check(io, Path::new("data"), &|_, _| {}).unwrap()
}

fn fix(io: &FaultIo) {
    let r = fsck(io);
    repair(
        Arc::new(io.clone()) as Arc<dyn Io>,
        config(SEG, Durability::EveryPut),
        &r,
    )
    .unwrap();
    let after = fsck(io);
    assert!(after.is_clean(), "after repair: {:?}", after.problems());
}

fn seg_path(id: u32) -> std::path::PathBuf {
    Path::new("data/segments").join(format!("{id:08x}.seg"))
}

fn filled() -> FaultIo {
    let io = FaultIo::new();
    let s = open(&io, SEG, Durability::EveryPut);
    put_range(&s, 1, 0, 12, 2500);
    s.close().unwrap();
    io
}

#[test]
fn a_clean_store_checks_clean_and_a_live_one_is_refused() {
    let io = filled();
    let r = fsck(&io);
    assert!(r.is_clean(), "{:?}", r.problems());
    assert_eq!(r.records, 12);
    let _live = open(&io, SEG, Durability::EveryPut);
    assert!(matches!(
        check(&io, Path::new("data"), &|_, _| {}),
        Err(Error::Locked { .. })
    ));
}

#[test]
fn a_torn_tail_is_found_and_truncated() {
    let io = FaultIo::new();
    let s = open(&io, 1 << 20, Durability::Manual);
    put_range(&s, 2, 0, 5, 2000);
    s.sync().unwrap();
    put_range(&s, 2, 5, 10, 2000);
    drop(s);
    io.crash(Crash::TornPrefix(99));
    let r = fsck(&io);
    assert!(
        r.segments.iter().any(|c| c.torn_tail.is_some()),
        "{:?}",
        r.problems()
    );
    fix(&io);
    let s = open(&io, 1 << 20, Durability::Manual);
    for i in 0..5 {
        assert_eq!(check_record(&s, 2, i, 2000), Some(true));
    }
}

fn check_record(s: &StateStore, seed: u64, i: u64, len: usize) -> Option<bool> {
    common::check(s, seed, i, len)
}

#[test]
fn a_bad_record_in_a_sealed_segment_is_found_and_dropped() {
    let io = filled();
    let s = open(&io, SEG, Durability::EveryPut);
    let rec = s.index().get(&key(3)).unwrap();
    drop(s);
    let path = seg_path(rec.segment);
    let mut b = io.read_file(&path).unwrap();
    b[rec.offset as usize + 400] ^= 4;
    io.write_file(&path, &b);
    let r = fsck(&io);
    let seg = r
        .segments
        .iter()
        .find(|c| c.id == u64::from(rec.segment))
        .unwrap();
    assert_eq!(seg.bad_records.len(), 1, "{:?}", r.problems());
    fix(&io);
    let s = open(&io, SEG, Durability::EveryPut);
    assert_eq!(check_record(&s, 1, 3, 2500), None);
    for i in (0..12).filter(|&i| i != 3) {
        assert_eq!(check_record(&s, 1, i, 2500), Some(true), "record {i}");
    }
}

#[test]
fn an_unreadable_footer_is_found_and_its_frames_salvaged() {
    let io = filled();
    let s = open(&io, SEG, Durability::EveryPut);
    let rec = s.index().get(&key(0)).unwrap();
    drop(s);
    let path = seg_path(rec.segment);
    let mut b = io.read_file(&path).unwrap();
    let n = b.len();
    b[n - 20] ^= 1; // the trailer
    io.write_file(&path, &b);
    let r = fsck(&io);
    assert!(
        r.segments.iter().any(|c| c.unreadable.is_some()),
        "{:?}",
        r.problems()
    );
    fix(&io);
    let s = open(&io, SEG, Durability::EveryPut);
    for i in 0..12 {
        assert_eq!(
            check_record(&s, 1, i, 2500),
            Some(true),
            "record {i} salvaged"
        );
    }
}

#[test]
fn orphans_are_found_and_removed() {
    let io = filled();
    let f = io.open(&seg_path(999), OpenMode::CreateNew).unwrap();
    f.write_all_at(b"left over", 0).unwrap();
    let r = fsck(&io);
    assert_eq!(r.orphans, vec![format!("{:08x}.seg", 999)]);
    fix(&io);
    assert!(!io.exists(&seg_path(999)));
}

#[test]
fn a_corrupt_manifest_is_not_repaired_in_place() {
    let io = filled();
    let p = Path::new("data/manifest.log");
    let mut b = io.read_file(p).unwrap();
    b[40] ^= 1; // inside the first record, valid ones follow
    io.write_file(p, &b);
    let r = fsck(&io);
    assert!(r.fatal.is_some() && !r.repairable());
    assert!(
        repair(
            Arc::new(io.clone()) as Arc<dyn Io>,
            config(SEG, Durability::EveryPut),
            &r
        )
        .is_err()
    );
}

#[test]
fn an_incompatible_store_can_be_discarded_to_start_empty() {
    let io = filled();
    let p = Path::new("data/orbitkv.dir");
    let mut h = io.read_file(p).unwrap();
    h[8..12].copy_from_slice(&7u32.to_le_bytes());
    let crc = orbitkv_segments::crc::crc32c(&h[..60]);
    h[60..64].copy_from_slice(&crc.to_le_bytes());
    io.write_file(p, &h);
    assert_eq!(fsck(&io).incompatible, Some((7, 1)));
    discard_incompatible(&io, Path::new("data")).unwrap();
    let s = open(&io, SEG, Durability::EveryPut);
    assert_eq!(check_record(&s, 1, 0, 2500), None);
    put_range(&s, 5, 0, 1, 100);
    assert_eq!(check_record(&s, 5, 0, 100), Some(true));
}

#[test]
fn a_damaged_checkpoint_is_refused_and_repair_keeps_every_segment() {
    // Every seal rewrites the manifest as one checkpoint, so close leaves it alone in the log.
    let io = FaultIo::new();
    let mut c = config(SEG, Durability::EveryPut);
    c.checkpoint_every = 1;
    let s = open_with(&io, c);
    put_range(&s, 1, 0, 12, 2500);
    s.close().unwrap();
    let manifest = Path::new("data/manifest.log");
    let bytes = io.read_file(manifest).unwrap();
    let first = orbitkv_wal::decode_record(&bytes, 0).unwrap();
    assert!(matches!(
        first.record,
        orbitkv_wal::ManifestRecord::Checkpoint(_)
    ));
    assert_eq!(first.len, bytes.len(), "the checkpoint is the whole log");
    let segments = io.list_dir(Path::new("data/segments")).unwrap();
    assert!(segments.iter().filter(|f| f.ends_with(".seg")).count() > 1);

    let mut bad = bytes.clone();
    let at = bytes.len() / 2;
    bad[at] ^= 0x10;
    assert!(io.write_file(manifest, &bad));
    // Not a torn tail: the open refuses instead of truncating the log to nothing.
    let opened = StateStore::open(
        Arc::new(io.clone()) as Arc<dyn Io>,
        config(SEG, Durability::EveryPut),
    );
    assert!(matches!(opened, Err(Error::Damaged { .. })));
    let r = fsck(&io);
    assert!(!r.repairable(), "{:?}", r.problems());
    assert!(r.orphans.is_empty(), "{:?}", r.orphans);
    assert!(
        repair(
            Arc::new(io.clone()) as Arc<dyn Io>,
            config(SEG, Durability::EveryPut),
            &r,
        )
        .is_err()
    );
    assert_eq!(
        io.read_file(manifest).unwrap(),
        bad,
        "the manifest is untouched"
    );
    assert_eq!(io.list_dir(Path::new("data/segments")).unwrap(), segments);

    // With the byte mended, every record is served again.
    assert!(io.write_file(manifest, &bytes));
    let s = open(&io, SEG, Durability::EveryPut);
    for i in 0..12 {
        assert_eq!(common::check(&s, 1, i, 2500), Some(true), "record {i}");
    }
}
