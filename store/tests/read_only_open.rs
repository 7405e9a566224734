//! A read-only open (what `inspect`, `fsck` without `--repair` and the crash harness's checks
//! use) changes nothing on disk: a torn manifest tail is left in place, not truncated, and the
//! records before it are served. On read-only media (a file system remounted read-only after
//! disk errors), where no lock file can be made, reads go on unlocked; writes do not.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use common::*;
use orbitkv_store::io::Io;
use orbitkv_store::io::fault::FaultIo;
use orbitkv_store::io::fault::FaultPlan;
use orbitkv_store::{Durability, Error, Layout, StateStore, fsck};

/// Every file under the data directory, with its bytes.
fn snapshot(io: &FaultIo) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut out = BTreeMap::new();
    for dir in [
        Path::new("data").to_path_buf(),
        Path::new("data/segments").to_path_buf(),
    ] {
        for name in io.list_dir(&dir).unwrap_or_default() {
            let p = dir.join(name);
            if let Some(b) = io.read_file(&p) {
                out.insert(p, b);
            }
        }
    }
    out
}

#[test]
fn a_read_only_open_leaves_a_torn_manifest_tail_in_place() {
    let io = FaultIo::new();
    let store = open(&io, 1 << 20, Durability::EveryPut);
    for i in 0..8 {
        let p = payload(5, i, 3000);
        store.put(&[(meta(i), p.as_slice())]).unwrap();
    }
    drop(store);
    // A torn append at the manifest's end.
    let manifest = Layout::new(Path::new("data")).manifest();
    let mut bytes = io.read_file(&manifest).unwrap();
    let valid = bytes.len();
    bytes.extend_from_slice(&[0x4f, 0x4b, 0x56, 0x4d, 0xff, 0x01, 0x02]);
    assert!(io.write_file(&manifest, &bytes));
    let before = snapshot(&io);

    let mut cfg = config(1 << 20, Durability::EveryPut);
    cfg.read_only = true;
    let store = StateStore::open(std::sync::Arc::new(io.clone()), cfg).unwrap();
    assert!(
        store.recovery_report().manifest_truncated,
        "the torn tail is found"
    );
    for i in 0..8 {
        assert_eq!(check(&store, 5, i, 3000), Some(true), "record {i}");
    }
    drop(store);
    assert_eq!(snapshot(&io), before, "nothing on disk changed");

    // A writable open truncates it, as before: the next open finds no torn tail.
    let store = open(&io, 1 << 20, Durability::EveryPut);
    assert!(store.recovery_report().manifest_truncated);
    drop(store);
    assert_eq!(io.read_file(&manifest).unwrap()[..valid], bytes[..valid]);
    let mut cfg = config(1 << 20, Durability::EveryPut);
    cfg.read_only = true;
    let store = StateStore::open(std::sync::Arc::new(io.clone()), cfg).unwrap();
    assert!(!store.recovery_report().manifest_truncated);
}

#[test]
fn reads_go_on_unlocked_where_no_lock_file_can_be_made() {
    let io = FaultIo::new();
    let store = open(&io, 1 << 20, Durability::EveryPut);
    put_range(&store, 7, 0, 8, 3000);
    drop(store);
    let read_only = || {
        let mut cfg = config(1 << 20, Durability::EveryPut);
        cfg.read_only = true;
        StateStore::open(std::sync::Arc::new(io.clone()), cfg)
    };
    for kind in [
        std::io::ErrorKind::ReadOnlyFilesystem,
        std::io::ErrorKind::PermissionDenied,
    ] {
        io.set_plan(FaultPlan {
            refuse_locks: Some(kind),
            ..FaultPlan::default()
        });
        let before = snapshot(&io);
        let report = fsck::check(&io, Path::new("data"), &|_, _| {})
            .unwrap_or_else(|e| panic!("{kind}: {e}"));
        assert!(report.is_clean(), "{kind}: {:?}", report.problems());
        let store = read_only().unwrap_or_else(|e| panic!("{kind}: {e}"));
        for i in 0..8 {
            assert_eq!(check(&store, 7, i, 3000), Some(true), "{kind}: record {i}");
        }
        drop(store);
        assert_eq!(snapshot(&io), before, "{kind}: nothing on disk changed");
        // A writable open needs the lock.
        let err = StateStore::open(
            std::sync::Arc::new(io.clone()),
            config(1 << 20, Durability::EveryPut),
        )
        .err();
        assert!(matches!(err, Some(Error::Io { .. })), "{kind}: {err:?}");
    }
    // Another failure, or a lock file that is there (a daemon may hold it), stops reads too.
    io.set_plan(FaultPlan {
        refuse_locks: Some(std::io::ErrorKind::Other),
        ..FaultPlan::default()
    });
    assert!(read_only().is_err());
    io.set_plan(FaultPlan::default());
    let lock_file = Layout::new(Path::new("data")).lock();
    drop(
        io.open(&lock_file, orbitkv_store::io::OpenMode::CreateNew)
            .unwrap(),
    );
    io.set_plan(FaultPlan {
        refuse_locks: Some(std::io::ErrorKind::ReadOnlyFilesystem),
        ..FaultPlan::default()
    });
    assert!(read_only().is_err());
    assert!(fsck::check(&io, Path::new("data"), &|_, _| {}).is_err());
}
