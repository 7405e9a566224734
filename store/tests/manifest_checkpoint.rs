//! The manifest is rewritten as one checkpoint when it grows long; the store reopens from it with
//! every record intact (crashes inside a checkpoint are swept by `crash_points.rs`). A checkpoint
//! that fails before it replaces the manifest (a full disk) refuses nothing: a later seal tries
//! again.

mod common;

use std::sync::Arc;

use common::*;
use orbitkv_store::io::Io;
use orbitkv_store::io::fault::{Crash, FaultIo, FaultPlan};
use orbitkv_store::{Durability, StateStore};

/// A store of small segments whose manifest is checkpointed every 8 records.
fn mk(io: &FaultIo) -> StateStore {
    let mut c = config(8 << 10, Durability::EveryPut);
    c.checkpoint_every = 8;
    let store =
        StateStore::open(Arc::new(io.clone()) as Arc<dyn Io>, c).unwrap_or_else(|e| panic!("{e}"));
    store
        .register_namespace(NS, info())
        .unwrap_or_else(|e| panic!("{e}"));
    store
}

#[test]
fn checkpoints_keep_the_manifest_short_and_complete() {
    let io = FaultIo::new();
    let store = mk(&io);
    put_range(&store, 6, 0, 200, 3000); // one segment each: ~600 lifecycle records
    // The log holds one checkpoint and at most `checkpoint_every` records after it.
    let bytes = io
        .read_file(std::path::Path::new("data/manifest.log"))
        .unwrap();
    assert_eq!(bytes.len() as u64, store.manifest_len());
    let r = orbitkv_wal::replay(&bytes);
    assert!(r.records <= 9, "{} records in the manifest", r.records);
    let first = orbitkv_wal::decode_record(&bytes, 0).unwrap();
    assert!(matches!(
        first.record,
        orbitkv_wal::ManifestRecord::Checkpoint(_)
    ));
    drop(store);
    io.crash(Crash::DropUnsynced);
    let store = mk(&io);
    for i in 0..200 {
        assert_eq!(check(&store, 6, i, 3000), Some(true), "record {i}");
    }
    assert!(store.recovery_report().quarantined.is_empty());
}

#[test]
fn a_checkpoint_failing_before_its_rename_is_tried_again() {
    let io = FaultIo::new();
    let store = mk(&io);
    // The checkpoint's temporary file is made but cannot be written (as on a full disk).
    io.set_plan(FaultPlan {
        fail_writes_of: Some("manifest.tmp".to_owned()),
        ..FaultPlan::default()
    });
    for i in 0..60 {
        let p = payload(8, i, 3000);
        store
            .put(&[(meta(i), p.as_slice())])
            .unwrap_or_else(|e| panic!("put {i} refused after a failed checkpoint: {e}"));
    }
    let long = store.manifest_len();
    assert!(
        !io.exists(std::path::Path::new("data/manifest.tmp")),
        "the temporary file is left"
    );
    // The fault ends: the next seals checkpoint the manifest short again.
    io.set_plan(FaultPlan::default());
    put_range(&store, 8, 60, 80, 3000);
    assert!(
        store.manifest_len() < long,
        "no checkpoint after the fault ended"
    );
    drop(store);
    io.crash(Crash::DropUnsynced);
    let store = mk(&io);
    for i in 0..80 {
        assert_eq!(check(&store, 8, i, 3000), Some(true), "record {i}");
    }
}
