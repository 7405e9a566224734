//! A segment or manifest far larger than anything the store writes (here a 1 TiB sparse file)
//! is reported as damage, never read whole into memory: fsck, repair, recovery of an active
//! segment, compaction and the manifest's open each give a clear report or error, and the
//! process does not abort.

#![expect(
    clippy::unwrap_used,
    reason = "test code: a failed unwrap is a failed test"
)]

mod common;

use std::fs::OpenOptions;
use std::path::Path;
use std::sync::Arc;

use common::*;
use orbitkv_store::io::std_io::StdIo;
use orbitkv_store::{Error, Layout, StateStore, StoreConfig, fsck};

/// A sparse size no store file reaches: reading it whole would abort the process.
const HUGE: u64 = 1 << 40;
const SEG: u64 = 64 << 10;
const LEN: usize = 16 << 10;
const RECORDS: u64 = 12;

fn config(dir: &Path) -> StoreConfig {
    let mut c = StoreConfig::new(dir);
    c.segment_bytes = SEG;
    c
}

fn open_real(dir: &Path) -> StateStore {
    let store = StateStore::open(Arc::new(StdIo), config(dir)).unwrap();
    store.register_namespace(NS, info()).unwrap();
    store
}

/// Puts records `0..RECORDS` (several segments of a few records each).
fn fill(store: &StateStore) {
    put_range(store, 1, 0, RECORDS, LEN);
}

/// Makes `path` a sparse file of [`HUGE`] bytes.
fn grow(path: &Path) {
    OpenOptions::new()
        .write(true)
        .open(path)
        .unwrap()
        .set_len(HUGE)
        .unwrap();
}

fn no_progress(_: u64, _: u64) {}

/// Why the open quarantined segment `id` ("" when it did not).
fn quarantined(r: &orbitkv_store::RecoveryReport, id: u64) -> &str {
    r.quarantined
        .iter()
        .find(|(q, _)| *q == id)
        .map_or("", |(_, why)| why.as_str())
}

#[test]
fn fsck_reports_a_huge_sealed_segment_and_repair_removes_it() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let store = open_real(dir);
    fill(&store);
    let stats = store.segment_stats().unwrap();
    let victim = stats[0].id;
    let lost = stats[0].live_records;
    assert!(stats.len() >= 2 && lost > 0, "{stats:?}");
    store.close().unwrap();
    let path = Layout::new(dir).segment(victim);
    grow(&path);

    let report = fsck::check(&StdIo, dir, &no_progress).unwrap();
    let seg = report.segments.iter().find(|s| s.id == victim).unwrap();
    let why = seg.unreadable.as_deref().unwrap_or_default();
    assert!(why.contains("more than any the store writes"), "{why}");
    assert!(report.bytes_read < HUGE, "{} bytes read", report.bytes_read);
    assert!(report.repairable(), "{:?}", report.problems());

    let done = fsck::repair(Arc::new(StdIo), config(dir), &report).unwrap();
    assert_eq!(done.segments_rewritten, vec![victim]);
    assert!(!path.exists(), "the damaged file was not removed");
    let again = fsck::check(&StdIo, dir, &no_progress).unwrap();
    assert!(again.is_clean(), "{:?}", again.problems());

    // Every record outside the damaged segment is still served, byte-exact.
    let store = open_real(dir);
    let served = (0..RECORDS)
        .filter(|&i| {
            let c = check(&store, 1, i, LEN);
            assert_ne!(c, Some(false), "record {i}: wrong bytes");
            c == Some(true)
        })
        .count() as u64;
    assert_eq!(served, RECORDS - lost);
}

#[test]
fn a_huge_manifest_refuses_the_open_and_fsck_reports_it() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let store = open_real(dir);
    fill(&store);
    store.close().unwrap();
    grow(&Layout::new(dir).manifest());

    match StateStore::open(Arc::new(StdIo), config(dir)) {
        Err(Error::Damaged { reason, .. }) => {
            assert!(reason.contains("manifest"), "{reason}");
            assert!(
                reason.contains("more than any the store writes"),
                "{reason}"
            );
        }
        Err(e) => panic!("expected a damaged store, got {e}"),
        Ok(_) => panic!("a 1 TiB manifest was opened"),
    }
    let report = fsck::check(&StdIo, dir, &no_progress).unwrap();
    let fatal = report.fatal.as_deref().unwrap_or_default();
    assert!(fatal.contains("manifest"), "{:?}", report.problems());
    assert!(!report.repairable());
    assert!(report.bytes_read < HUGE);
}

#[test]
fn a_huge_active_segment_is_quarantined_on_open() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let store = open_real(dir);
    fill(&store);
    let active: Vec<u64> = store
        .segments()
        .into_iter()
        .filter_map(|(id, sealed)| (!sealed).then_some(id))
        .collect();
    assert_eq!(active.len(), 1, "{:?}", store.segments());
    let active = active[0];
    // Dropped without closing: the active segment is scanned whole on the next open.
    drop(store);
    grow(&Layout::new(dir).segment(active));

    let store = open_real(dir);
    let r = store.recovery_report();
    let why = quarantined(r, active);
    assert!(why.contains("more than any the store writes"), "{r:?}");
    assert!(r.bytes_read < HUGE, "{} bytes read", r.bytes_read);
    // The sealed segments are served; what the huge file held is a miss, never wrong bytes.
    let served = (0..RECORDS)
        .filter(|&i| {
            let c = check(&store, 1, i, LEN);
            assert_ne!(c, Some(false), "record {i}: wrong bytes");
            c == Some(true)
        })
        .count() as u64;
    assert!(served > 0 && served < RECORDS, "{served} served");
    // Its bytes stay counted in what the segments take.
    assert!(store.usage().ssd_used >= HUGE);
    drop(store);
    let report = fsck::check(&StdIo, dir, &no_progress).unwrap();
    let seg = report.segments.iter().find(|s| s.id == active).unwrap();
    assert!(seg.unreadable.is_some(), "{:?}", report.problems());
}

#[test]
fn compaction_of_a_segment_grown_huge_fails_cleanly() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let store = open_real(dir);
    fill(&store);
    let stats = store.segment_stats().unwrap();
    let victim = stats[0].id;
    grow(&Layout::new(dir).segment(victim));

    match store.compact(&[victim]) {
        Err(Error::Damaged { reason, .. }) => assert!(!reason.is_empty()),
        other => panic!("expected a damaged segment, got {other:?}"),
    }
    // Statistics skip what they cannot read; the store keeps serving the other segments.
    let after = store.segment_stats().unwrap();
    assert!(after.iter().all(|s| s.id != victim), "{after:?}");
    let last = RECORDS - 1;
    assert_eq!(check(&store, 1, last, LEN), Some(true));
}

/// The highest resident memory of this process so far, in bytes (`VmHWM`).
fn peak_resident() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    line.split_whitespace()
        .nth(1)
        .unwrap()
        .parse::<u64>()
        .unwrap()
        * 1024
}

#[test]
fn a_forged_trailer_naming_a_huge_footer_is_refused_before_it_is_allocated() {
    use orbitkv_segments::{TRAILER_LEN, Trailer};
    use std::os::unix::fs::FileExt;
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let store = open_real(dir);
    fill(&store);
    let victim = store.segment_stats().unwrap()[0].id;
    store.close().unwrap();
    // A trailer with a valid checksum that names an 8 GiB footer after 8 GiB of frames, in a
    // sparse file long enough to hold them: only the manifest's digest tells it is not the
    // segment's own.
    let path = Layout::new(dir).segment(victim);
    let file = OpenOptions::new().write(true).open(&path).unwrap();
    let (at, footer) = (8u64 << 30, 8u64 << 30);
    let len = at + footer + TRAILER_LEN as u64;
    file.set_len(len).unwrap();
    let forged = Trailer {
        footer_offset: at,
        footer_len: footer,
        segment_sequence: 0,
        footer_digest: [7; 32],
    };
    file.write_all_at(&forged.encode(), len - TRAILER_LEN as u64)
        .unwrap();
    drop(file);

    let before = peak_resident();
    let store = open_real(dir);
    let grew = peak_resident().saturating_sub(before);
    assert!(grew < 1 << 30, "opening took {grew} more bytes of memory");
    let r = store.recovery_report();
    let why = quarantined(r, victim);
    assert!(why.contains("digest differs"), "{r:?}");
}
