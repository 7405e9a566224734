//! Deletes, directory fsyncs and size queries that fail in compaction and reclaim are counted
//! and logged, never swallowed; the SSD budget stays conservative: a file that could not be
//! deleted, or came back after a power loss, is still counted, and a size that cannot be read
//! counts as what the store knows of the file, never as 0.

#![expect(
    clippy::unwrap_used,
    reason = "test code: a failed unwrap is a failed test"
)]

mod common;

use std::any::Any;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use common::*;
use orbitkv_store::io::fault::{Crash, FaultIo, FaultPlan};
use orbitkv_store::io::{Io, IoFile, OpenMode, WriteBuf};
use orbitkv_store::{Durability, Error, StateStore, StoreConfig, fsck};

const LEN: usize = 4096;
const BUDGET: u64 = 1 << 20;

/// Which operations the wrapper fails.
#[derive(Default)]
struct Faults {
    removes: AtomicBool,
    /// Size queries of files whose path contains this fail.
    sizes_of: Mutex<Option<String>>,
}

/// [`FaultIo`] with failing removals and size queries.
#[derive(Clone)]
struct Flaky {
    inner: FaultIo,
    faults: Arc<Faults>,
}

impl Flaky {
    fn new(inner: &FaultIo) -> Self {
        Self {
            inner: inner.clone(),
            faults: Arc::default(),
        }
    }

    fn fail_removes(&self, on: bool) {
        self.faults.removes.store(on, Ordering::SeqCst);
    }

    fn fail_sizes_of(&self, pattern: Option<&str>) {
        *self.faults.sizes_of.lock().unwrap() = pattern.map(str::to_owned);
    }
}

struct FlakyFile {
    inner: Arc<dyn IoFile>,
    path: PathBuf,
    faults: Arc<Faults>,
}

impl IoFile for FlakyFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<usize> {
        self.inner.write_at(buf, offset)
    }
    fn sync(&self) -> io::Result<()> {
        self.inner.sync()
    }
    fn size(&self) -> io::Result<u64> {
        let failing = self.faults.sizes_of.lock().unwrap().clone();
        if failing.is_some_and(|p| self.path.to_string_lossy().contains(p.as_str())) {
            return Err(io::Error::other("injected: stat failed"));
        }
        self.inner.size()
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.inner.set_len(len)
    }
    fn preallocate(&self, len: u64) -> io::Result<()> {
        self.inner.preallocate(len)
    }
    fn submit_write(&self, buf: &Arc<WriteBuf>, offset: u64) -> io::Result<bool> {
        self.inner.submit_write(buf, offset)
    }
    fn complete_writes(&self, in_flight: usize) -> io::Result<Vec<u64>> {
        self.inner.complete_writes(in_flight)
    }
}

impl Io for Flaky {
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Arc<dyn IoFile>> {
        Ok(Arc::new(FlakyFile {
            inner: self.inner.open(path, mode)?,
            path: path.to_owned(),
            faults: self.faults.clone(),
        }))
    }
    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        self.inner.create_dir_all(path)
    }
    fn list_dir(&self, path: &Path) -> io::Result<Vec<String>> {
        self.inner.list_dir(path)
    }
    fn exists(&self, path: &Path) -> bool {
        self.inner.exists(path)
    }
    fn remove_file(&self, path: &Path) -> io::Result<()> {
        if self.faults.removes.load(Ordering::SeqCst) {
            return Err(io::Error::other("injected: unlink failed"));
        }
        self.inner.remove_file(path)
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.inner.rename(from, to)
    }
    fn sync_dir(&self, path: &Path) -> io::Result<()> {
        self.inner.sync_dir(path)
    }
    fn lock_exclusive(&self, path: &Path) -> io::Result<Box<dyn Any + Send + Sync>> {
        self.inner.lock_exclusive(path)
    }
}

fn segments_dir() -> &'static Path {
    Path::new("data/segments")
}

/// Bytes of every file in the segments directory, as the device holds them.
fn disk_bytes(io: &FaultIo) -> u64 {
    let dir = segments_dir();
    io.list_dir(dir)
        .unwrap_or_default()
        .iter()
        .map(|n| io.read_file(&dir.join(n)).map_or(0, |b| b.len() as u64))
        .sum()
}

fn bounded() -> StoreConfig {
    let mut c = StoreConfig::new("data");
    c.ssd_bytes = Some(BUDGET);
    c
}

fn open_on(io: &Flaky, config: StoreConfig) -> StateStore {
    let store = StateStore::open(Arc::new(io.clone()), config).unwrap();
    store.register_namespace(NS, info()).unwrap();
    store
}

#[test]
fn a_segment_file_that_cannot_be_deleted_stays_in_the_ssd_budget() {
    let fault = FaultIo::new();
    let io = Flaky::new(&fault);
    let store = open_on(&io, bounded());
    io.fail_removes(true);
    // Reclaim cannot free what it cannot delete: the tier fills up and then refuses puts,
    // rather than letting the files outgrow the budget.
    let mut refused = None;
    for i in 0..2_000u64 {
        let p = payload(1, i, LEN);
        match store.put(&[(meta(i), p.as_slice())]) {
            Ok(_) => {}
            Err(e @ Error::CapacityExhausted { .. }) => {
                refused = Some((i, e));
                break;
            }
            Err(e) => panic!("put {i}: {e}"),
        }
        let used = store.usage().ssd_used;
        assert!(used <= BUDGET, "{used} bytes counted after put {i}");
        assert!(
            disk_bytes(&fault) <= used,
            "put {i}: {} bytes on disk, {used} counted",
            disk_bytes(&fault)
        );
    }
    let (at, _) = refused.expect("the budget was never reached");
    let s = store.stats();
    assert!(s.failed_deletes > 0 && s.reclaimed_segments > 0, "{s:?}");
    assert!(disk_bytes(&fault) <= BUDGET);
    drop(store);

    // After a restart the leftovers are orphans, still counted, until fsck removes them.
    io.fail_removes(false);
    let store = open_on(&io, bounded());
    assert!(!store.recovery_report().orphans.is_empty());
    assert!(store.usage().ssd_used >= disk_bytes(&fault));
    drop(store);
    let report = fsck::check(&fault, Path::new("data"), &|_, _| {}).unwrap();
    assert!(!report.orphans.is_empty());
    let done = fsck::repair(Arc::new(fault.clone()), bounded(), &report).unwrap();
    assert_eq!(done.orphans_removed.len(), report.orphans.len());
    assert!(done.orphans_not_removed.is_empty() && done.dir_sync_failed.is_none());
    let store = open_on(&io, bounded());
    assert!(store.recovery_report().orphans.is_empty());
    assert!(store.usage().ssd_used >= disk_bytes(&fault));
    let p = payload(1, at, LEN);
    store.put(&[(meta(at), p.as_slice())]).unwrap();
}

#[test]
fn repair_reports_orphans_it_cannot_remove() {
    let fault = FaultIo::new();
    let io = Flaky::new(&fault);
    let store = open_on(&io, StoreConfig::new("data"));
    put_range(&store, 1, 0, 4, LEN);
    store.close().unwrap();
    let orphan = segments_dir().join(format!("{:08x}.seg", 999));
    let f = fault.open(&orphan, OpenMode::CreateNew).unwrap();
    f.write_all_at(&[7u8; 100], 0).unwrap();
    let report = fsck::check(&fault, Path::new("data"), &|_, _| {}).unwrap();
    assert_eq!(report.orphans.len(), 1);
    io.fail_removes(true);
    let done = fsck::repair(Arc::new(io.clone()), StoreConfig::new("data"), &report).unwrap();
    assert!(done.orphans_removed.is_empty());
    assert_eq!(done.orphans_not_removed.len(), 1, "{done:?}");
    assert!(done.orphans_not_removed[0].1.contains("unlink failed"));
}

#[test]
fn a_failed_directory_fsync_after_compaction_is_counted_and_its_leftovers_stay_counted() {
    let fault = FaultIo::new();
    let io = Flaky::new(&fault);
    let mut c = StoreConfig::new("data");
    c.segment_bytes = 24 << 10;
    c.durability = Durability::EveryPut;
    let store = open_on(&io, c.clone());
    put_range(&store, 1, 0, 20, LEN);
    store.retire_namespace(NS).unwrap();
    let sealed: Vec<u64> = store
        .segments()
        .into_iter()
        .filter_map(|(id, sealed)| sealed.then_some(id))
        .collect();
    assert!(sealed.len() >= 2);
    // Every record is dead: the compaction writes no output, and its one directory fsync is
    // the one after the deletions.
    fault.set_plan(FaultPlan {
        fail_sync_dir: Some(1),
        ..FaultPlan::default()
    });
    let r = store.compact(&sealed).unwrap();
    assert_eq!(r.inputs, sealed);
    assert!(r.outputs.is_empty());
    let s = store.stats();
    assert_eq!((s.failed_dir_syncs, s.failed_deletes), (1, 0), "{s:?}");
    drop(store);

    // The deletions were not durable: after a power loss the files come back as orphans, and
    // the SSD budget counts them.
    fault.crash(Crash::DropUnsynced);
    let store = open_on(&io, c);
    let orphans = store.recovery_report().orphans.clone();
    assert_eq!(orphans.len(), sealed.len(), "{orphans:?}");
    assert!(store.usage().ssd_used >= disk_bytes(&fault));
}

#[test]
fn a_failed_size_query_counts_what_is_known_never_zero() {
    let fault = FaultIo::new();
    let io = Flaky::new(&fault);
    let mut c = StoreConfig::new("data");
    c.segment_bytes = 24 << 10;
    let store = open_on(&io, c.clone());
    put_range(&store, 1, 0, 20, LEN);
    // Newer versions of the last records: their old segment becomes dead weight.
    put_range(&store, 2, 15, 20, LEN);
    let stats = store.segment_stats().unwrap();
    let first = stats[0].id;
    let dead: Vec<u64> = stats
        .iter()
        .filter(|s| s.live_fraction() < 1.0)
        .map(|s| s.id)
        .collect();
    assert!(!dead.is_empty() && !dead.contains(&first), "{stats:?}");

    // The first segment's size cannot be read while compaction recounts the tier.
    io.fail_sizes_of(Some(&format!("{first:08x}.seg")));
    store.compact(&dead).unwrap();
    let s = store.stats();
    assert!(s.failed_stats > 0, "{s:?}");
    let used = store.usage().ssd_used;
    assert!(used >= disk_bytes(&fault), "{used} counted");
    drop(store);

    // On open the file cannot be sized either (it is quarantined): still counted.
    let store = open_on(&io, c);
    assert!(
        store
            .recovery_report()
            .quarantined
            .iter()
            .any(|(id, _)| *id == first)
    );
    assert!(store.stats().failed_stats > 0);
    assert!(store.usage().ssd_used >= disk_bytes(&fault));
}
