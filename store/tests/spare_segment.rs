//! A full direct store recycles: the segment reclaimed as a new one starts becomes that
//! segment's file (kept for an instant as `segments/spare.free`), so appends overwrite written
//! blocks. Nothing of the file's earlier life is ever served, before or after a crash; the
//! budget holds after every put; a spare left by a restart is reused, or removed by a store
//! that does not recycle.

mod common;

use std::collections::HashSet;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use common::*;
use orbitkv_segments::Alignment;
use orbitkv_store::io::Io;
use orbitkv_store::io::std_io::StdIo;
use orbitkv_store::{Durability, Policy, StateStore, StoreConfig};

/// Records of 256 KiB; segments of 2 MiB (a 64th of the budget) hold seven.
const LEN: usize = 256 << 10;
const BUDGET: u64 = 128 << 20;

fn config(dir: &Path, ssd_bytes: Option<u64>) -> StoreConfig {
    let mut cfg = StoreConfig::new(dir);
    cfg.alignment = Alignment::Direct;
    cfg.durability = Durability::Manual;
    cfg.ssd_bytes = ssd_bytes;
    // Recycling is the log policies' (record-lru punches records out instead).
    cfg.policy = Policy::FifoReinsert;
    cfg
}

fn open_on(io: &Arc<dyn Io>, cfg: StoreConfig) -> StateStore {
    let store = StateStore::open(io.clone(), cfg).unwrap_or_else(|e| panic!("{e}"));
    store
        .register_namespace(NS, info())
        .unwrap_or_else(|e| panic!("{e}"));
    store
}

fn segment_path(dir: &Path, id: u64) -> PathBuf {
    dir.join("segments").join(format!("{id:08x}.seg"))
}

fn inode(p: &Path) -> Option<u64> {
    std::fs::metadata(p).ok().map(|m| m.ino())
}

fn active(store: &StateStore) -> Option<u64> {
    store
        .segments()
        .into_iter()
        .find_map(|(id, sealed)| (!sealed).then_some(id))
}

fn spare(dir: &Path) -> PathBuf {
    dir.join("segments").join(orbitkv_store::dir::SPARE_SEGMENT)
}

/// Puts record `i`; whether it started a new segment over a file that held a sealed segment
/// (`seen`, the inodes of sealed segment files, gains those before the put).
fn put_one(store: &StateStore, dir: &Path, i: u64, seen: &mut HashSet<u64>) -> bool {
    for (id, sealed) in store.segments() {
        if sealed {
            seen.extend(inode(&segment_path(dir, id)));
        }
    }
    let before = active(store);
    let p = payload(3, i, LEN);
    store
        .put(&[(meta(i), p.as_slice())])
        .unwrap_or_else(|e| panic!("put {i}: {e}"));
    let now = active(store);
    now != before
        && now.is_some_and(|id| inode(&segment_path(dir, id)).is_some_and(|n| seen.contains(&n)))
}

/// Puts records `from..to`; returns how many new segments took over a reclaimed segment's
/// file. Checks the budget and that no spare outlives a put.
fn put_counting_recycled(store: &StateStore, dir: &Path, from: u64, to: u64) -> usize {
    let mut seen = HashSet::new();
    let mut recycled = 0;
    for i in from..to {
        recycled += usize::from(put_one(store, dir, i, &mut seen));
        let used = store.usage().ssd_used;
        assert!(used <= BUDGET, "{used} bytes counted after put {i}");
        assert!(!spare(dir).exists(), "a spare outlived put {i}");
    }
    recycled
}

/// A direct store in a new directory, filled past its budget with records `0..700`; `None`
/// (skipped) without O_DIRECT.
fn full_store() -> Option<(tempfile::TempDir, PathBuf, Arc<dyn Io>, StateStore)> {
    let root = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let dir = root.path().join("d");
    let io: Arc<dyn Io> = Arc::new(direct_or_skip(root.path())?);
    let store = open_on(&io, config(&dir, Some(BUDGET)));
    put_counting_recycled(&store, &dir, 0, 700);
    Some((root, dir, io, store))
}

/// Closes `store`; fsck then finds nothing wrong.
fn close_clean(store: StateStore, dir: &Path) {
    store.close().unwrap_or_else(|e| panic!("{e}"));
    let report =
        orbitkv_store::fsck::check(&StdIo, dir, &|_, _| {}).unwrap_or_else(|e| panic!("{e}"));
    assert!(report.is_clean(), "{:?}", report.problems());
}

#[test]
fn a_full_direct_store_writes_new_segments_over_reclaimed_files() {
    // 700 records of 256 KiB: 175 MiB into a budget of 128 MiB, then 500 more.
    let Some((_root, dir, _io, store)) = full_store() else {
        return;
    };
    let recycled = put_counting_recycled(&store, &dir, 700, 1_200);
    let s = store.stats();
    assert!(s.reclaimed_segments > 0, "{s:?}");
    assert!(s.recycled_segments >= recycled as u64, "{s:?}");
    assert!(
        recycled > 50,
        "{recycled} of about 70 new segments took over a reclaimed file"
    );
    store.sync().unwrap_or_else(|e| panic!("{e}"));
    // What is indexed is exactly what was put; the newest records are all there.
    let mut found = 0;
    for i in 0..1_200 {
        match check(&store, 3, i, LEN) {
            Some(true) => found += 1,
            Some(false) => panic!("record {i} served other bytes"),
            None => {}
        }
    }
    assert!(found > 400, "{found} records held");
    for i in 1_150..1_200 {
        assert_eq!(check(&store, 3, i, LEN), Some(true), "record {i}");
    }
    close_clean(store, &dir);
}

#[test]
fn a_crash_over_a_recycled_file_serves_none_of_its_earlier_records() {
    let Some((_root, dir, io, store)) = full_store() else {
        return;
    };
    // Put until a new segment takes over a reclaimed file: the file holds the new header, a
    // new frame, then its earlier life's frames.
    let mut seen = HashSet::new();
    let mut i = 700;
    while !put_one(&store, &dir, i, &mut seen) {
        i += 1;
        assert!(i < 800, "no new segment took over a reclaimed file");
    }
    i += 1;
    store.sync().unwrap_or_else(|e| panic!("{e}"));
    let last = i;
    let recycled = segment_path(&dir, active(&store).unwrap_or_else(|| panic!("no active")));
    let size = std::fs::metadata(&recycled).map_or(0, |m| m.len());
    assert!(
        size > (LEN as u64) * 3,
        "{size} bytes: not the reclaimed file"
    );
    // Which records the store no longer holds (evicted): none may come back.
    let gone: Vec<u64> = (0..last)
        .filter(|i| check(&store, 3, *i, LEN).is_none())
        .collect();
    assert!(!gone.is_empty());

    // Dropped without closing, as a killed daemon.
    drop(store);
    let store = open_on(&io, config(&dir, Some(BUDGET)));
    let report = store.recovery_report().clone();
    assert!(
        report.corrupt_records.is_empty() && report.quarantined.is_empty(),
        "{report:?}"
    );
    assert!(report.orphans.is_empty(), "{:?}", report.orphans);
    // The earlier life's frames were cut off as a torn tail.
    assert!(
        report.torn_tails.iter().any(|(_, len)| *len < size),
        "{report:?}"
    );
    for i in 0..last {
        match check(&store, 3, i, LEN) {
            Some(true) => assert!(!gone.contains(&i), "evicted record {i} came back"),
            Some(false) => panic!("record {i} served other bytes"),
            None => assert!(gone.contains(&i), "synced record {i} lost"),
        }
    }
    close_clean(store, &dir);
}

#[test]
fn a_spare_left_by_a_restart_is_reused_or_removed() {
    let Some((_root, dir, io, store)) = full_store() else {
        return;
    };
    store.close().unwrap_or_else(|e| panic!("{e}"));
    // A spare, as a crash between a reclaim and the new segment's takeover leaves one: a copy
    // of a sealed segment's file, with that segment's frames.
    let sealed = std::fs::read_dir(dir.join("segments"))
        .unwrap_or_else(|e| panic!("{e}"))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "seg"))
        .unwrap_or_else(|| panic!("no segment"));
    std::fs::copy(&sealed, spare(&dir)).unwrap_or_else(|e| panic!("{e}"));
    let spare_inode = inode(&spare(&dir));

    // Reopened full: the spare is no orphan, and the next new segment takes it over.
    let store = open_on(&io, config(&dir, Some(BUDGET)));
    assert!(
        store.recovery_report().orphans.is_empty(),
        "{:?}",
        store.recovery_report().orphans
    );
    let first = active(&store);
    let mut i = 700;
    while active(&store) == first {
        let p = payload(3, i, LEN);
        store
            .put(&[(meta(i), p.as_slice())])
            .unwrap_or_else(|e| panic!("{e}"));
        i += 1;
    }
    let id = active(&store).unwrap_or_else(|| panic!("no active"));
    assert_eq!(inode(&segment_path(&dir, id)), spare_inode);
    assert!(!spare(&dir).exists());
    for j in i - 3..i {
        assert_eq!(check(&store, 3, j, LEN), Some(true), "record {j}");
    }
    store.close().unwrap_or_else(|e| panic!("{e}"));

    // A store without an SSD budget reclaims nothing: it removes a spare on open.
    std::fs::copy(segment_path(&dir, id), spare(&dir)).unwrap_or_else(|e| panic!("{e}"));
    let store = open_on(&io, config(&dir, None));
    assert!(!spare(&dir).exists());
    assert!(store.recovery_report().orphans.is_empty());
    store.close().unwrap_or_else(|e| panic!("{e}"));
}
