//! The manifest is rewritten as one checkpoint when it grows long; the store reopens from it with
//! every record intact (crashes inside a checkpoint are swept by `crash_points.rs`).

mod common;

use std::sync::Arc;

use common::*;
use orbitkv_store::io::Io;
use orbitkv_store::io::fault::{Crash, FaultIo};
use orbitkv_store::{Durability, StateStore};

#[test]
fn checkpoints_keep_the_manifest_short_and_complete() {
    let io = FaultIo::new();
    let mk = |io: &FaultIo| {
        let mut c = config(8 << 10, Durability::EveryPut);
        c.checkpoint_every = 8;
        let store = StateStore::open(Arc::new(io.clone()) as Arc<dyn Io>, c).unwrap();
        store.register_namespace(NS, info()).unwrap();
        store
    };
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
