//! A direct segment's file size is set ahead of its appends, within the blocks reserved at
//! creation, so that ext4 runs its direct writes side by side instead of one extending write at
//! a time. The space past the appends is not counted against the SSD budget, a store dropped
//! without closing recovers every synced record over the zeros past them, and sealing leaves
//! the file its exact size.

mod common;

use std::path::Path;
use std::sync::Arc;

use common::*;
use orbitkv_segments::Alignment;
use orbitkv_store::io::Io;
use orbitkv_store::io::std_io::StdIo;
use orbitkv_store::{Durability, StateStore, StoreConfig};

/// Above the write-behind threshold: each put is its own write in flight.
const LEN: usize = 3 << 19;
const SEGMENT: u64 = 16 << 20;

fn file_len(p: &Path) -> u64 {
    std::fs::metadata(p).map_or(0, |m| m.len())
}

fn open_direct(io: &Arc<dyn Io>, dir: &Path) -> StateStore {
    let mut cfg = StoreConfig::new(dir);
    cfg.segment_bytes = SEGMENT;
    cfg.alignment = Alignment::Direct;
    cfg.durability = Durability::Manual;
    let store = StateStore::open(io.clone(), cfg).unwrap_or_else(|e| panic!("{e}"));
    store
        .register_namespace(NS, info())
        .unwrap_or_else(|e| panic!("{e}"));
    store
}

fn active_path(store: &StateStore, dir: &Path) -> std::path::PathBuf {
    let (id, _) = store
        .segments()
        .into_iter()
        .find(|(_, sealed)| !sealed)
        .unwrap_or_else(|| panic!("no active segment"));
    dir.join("segments").join(format!("{id:08x}.seg"))
}

#[test]
fn direct_segments_are_sized_ahead_counted_by_their_appends_and_sealed_exact() {
    let root = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let dir = root.path().join("d");
    let Some(direct) = direct_or_skip(root.path()) else {
        return;
    };
    uring_or_skip("writes in flight");
    let io: Arc<dyn Io> = Arc::new(direct);
    let store = open_direct(&io, &dir);
    // The first segment seals after about ten records; the second holds the rest.
    put_range(&store, 7, 0, 14, LEN);
    store.sync().unwrap_or_else(|e| panic!("{e}"));
    let active = active_path(&store, &dir);
    let size = file_len(&active);
    let in_active = (0..14u64)
        .filter(|i| {
            store
                .index()
                .get(&key(*i))
                .is_some_and(|r| active.ends_with(format!("{:08x}.seg", r.segment)))
        })
        .count() as u64;
    let appended = in_active * LEN as u64;
    assert!(
        in_active > 0 && size > appended + (4 << 20) && size <= SEGMENT,
        "the file is {size} bytes after {in_active} records appended: not sized ahead"
    );
    // A compaction recounts the directory's files: the active segment counts its appends.
    let sealed: Vec<u64> = store
        .segments()
        .into_iter()
        .filter_map(|(id, sealed)| sealed.then_some(id))
        .collect();
    assert!(!sealed.is_empty(), "no segment sealed");
    store.compact(&sealed).unwrap_or_else(|e| panic!("{e}"));
    let files: u64 = std::fs::read_dir(dir.join("segments"))
        .unwrap_or_else(|e| panic!("{e}"))
        .map(|e| file_len(&e.unwrap_or_else(|e| panic!("{e}")).path()))
        .sum();
    let used = store.usage().ssd_used;
    assert!(
        used >= 14 * LEN as u64 && used + (size - appended) <= files + (1 << 20),
        "{used} bytes counted against the budget; the files hold {files}, the active one \
         {size} for {appended} bytes appended"
    );

    // Dropped without closing, as a killed daemon: every synced record is there after the
    // zeros past the appends, which recovery cuts off.
    drop(store);
    assert_eq!(file_len(&active), size, "a drop does not seal");
    // fsck before recovery: the zeros past the appends are unwritten space, not damage.
    let report =
        orbitkv_store::fsck::check(&StdIo, &dir, &|_, _| {}).unwrap_or_else(|e| panic!("{e}"));
    assert!(report.is_clean(), "{:?}", report.problems());
    let store = open_direct(&io, &dir);
    for i in 0..14 {
        assert_eq!(check(&store, 7, i, LEN), Some(true), "record {i}");
    }
    assert!(
        store.recovery_report().corrupt_records.is_empty(),
        "{:?}",
        store.recovery_report()
    );
    assert!(
        file_len(&active) < size,
        "the zeros past the appends were kept"
    );
    put_range(&store, 7, 14, 17, LEN);
    store.close().unwrap_or_else(|e| panic!("{e}"));

    // Sealed: each file ends at its trailer (fsck reads it from the file's end), and fsck
    // finds nothing wrong.
    let report =
        orbitkv_store::fsck::check(&StdIo, &dir, &|_, _| {}).unwrap_or_else(|e| panic!("{e}"));
    assert!(report.is_clean(), "{:?}", report.problems());
    let store = open_direct(&io, &dir);
    for i in 0..17 {
        assert_eq!(
            check(&store, 7, i, LEN),
            Some(true),
            "record {i} after close"
        );
    }
}
