//! A key put twice has two records: the newer supersedes the older. When the newer one's bytes
//! are damaged, the key is a miss in that session (the damaged record is dropped, the older one
//! is not indexed), and once fsck's repair has removed the damaged record the older intact copy
//! serves the key again after a restart. That is correct by construction: a key names its
//! content (the model computation, the token chain, the group, component and rank), so both
//! records of one key hold the same state; what the older copy can never outlive is its
//! namespace's retirement, whose watermark covers every record below it.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use common::*;
use orbitkv_segments::FRAME_HEADER_LEN;
use orbitkv_store::io::Io;
use orbitkv_store::io::fault::FaultIo;
use orbitkv_store::{Durability, fsck};

const LEN: usize = 5000;
const SEGMENT_BYTES: u64 = 32 << 10;

/// Flips one payload byte of the record now indexed for `i`.
fn damage_newest(io: &FaultIo, store: &orbitkv_store::StateStore, i: u64) {
    let r = store
        .index()
        .get(&key(i))
        .unwrap_or_else(|| panic!("record {i} not indexed"));
    let path = Path::new("data/segments").join(format!("{:08x}.seg", r.segment));
    let mut bytes = io
        .read_file(&path)
        .unwrap_or_else(|| panic!("no file {}", path.display()));
    let at = r.offset as usize + FRAME_HEADER_LEN + 100;
    bytes[at] ^= 0x40;
    assert!(io.write_file(&path, &bytes));
}

fn repair(io: &FaultIo) {
    let report =
        fsck::check(io, &PathBuf::from("data"), &|_, _| {}).unwrap_or_else(|e| panic!("{e}"));
    assert!(!report.is_clean(), "fsck missed the damage");
    let io_arc: Arc<dyn Io> = Arc::new(io.clone());
    fsck::repair(io_arc, config(SEGMENT_BYTES, Durability::EveryPut), &report)
        .unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn an_older_copy_serves_the_key_once_the_damaged_newer_one_is_repaired_away() {
    let io = FaultIo::new();
    let store = open(&io, SEGMENT_BYTES, Durability::EveryPut);
    // Record 0, then enough others to seal its segment, then record 0 again (same content).
    put_range(&store, 1, 0, 10, LEN);
    put_range(&store, 1, 0, 1, LEN);
    let older = store.segments().len();
    assert!(older > 1, "the second copy should be in a later segment");
    damage_newest(&io, &store, 0);
    // This session: the damaged copy is a miss, never other bytes.
    assert_eq!(check(&store, 1, 0, LEN), None);
    assert_eq!(store.stats().checksum_failures, 1);
    store.close().unwrap_or_else(|e| panic!("{e}"));
    // Reopened without repair: the damaged record is still the newest, still a miss.
    let store = open(&io, SEGMENT_BYTES, Durability::EveryPut);
    assert_eq!(check(&store, 1, 0, LEN), None);
    store.close().unwrap_or_else(|e| panic!("{e}"));
    // Repaired: the damaged record is gone and the older copy, intact, is the key's record.
    repair(&io);
    let store = open(&io, SEGMENT_BYTES, Durability::EveryPut);
    assert_eq!(check(&store, 1, 0, LEN), Some(true), "the older copy");
    for i in 1..10 {
        assert_eq!(check(&store, 1, i, LEN), Some(true), "record {i}");
    }
    assert_eq!(store.stats().checksum_failures, 0);
}

#[test]
fn an_older_copy_never_outlives_its_namespace_retirement() {
    let io = FaultIo::new();
    let store = open(&io, SEGMENT_BYTES, Durability::EveryPut);
    put_range(&store, 2, 0, 10, LEN);
    put_range(&store, 2, 0, 1, LEN);
    damage_newest(&io, &store, 0);
    store.retire_namespace(NS).unwrap_or_else(|e| panic!("{e}"));
    store.close().unwrap_or_else(|e| panic!("{e}"));
    repair(&io);
    let store = open(&io, SEGMENT_BYTES, Durability::EveryPut);
    for i in 0..10 {
        let mut out = Vec::new();
        let got = store
            .get(&key(i), &mut out)
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(got.is_none(), "record {i} of a retired namespace served");
    }
}
