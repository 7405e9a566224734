//! A key put twice leaves its older record on disk until that segment goes. When the newer
//! record's segment is reclaimed first (S3-FIFO reclaims the probation log before the main log),
//! the newer record is kept, so a restart never serves the superseded one. Found by the
//! `store_model` fuzz target.

mod common;

use std::sync::Arc;

use common::*;
use orbitkv_store::io::Io;
use orbitkv_store::io::fault::FaultIo;
use orbitkv_store::{Durability, Policy, StateStore, StoreConfig};

const LEN: usize = 4096;
const K: u64 = 0;

fn bounded() -> StoreConfig {
    let mut c = StoreConfig::new("data");
    c.durability = Durability::EveryPut;
    c.ssd_bytes = Some(1 << 20);
    c.policy = Policy::S3Fifo;
    c
}

fn get(store: &StateStore, i: u64) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    store
        .get(&key(i), &mut out)
        .unwrap_or_else(|e| panic!("{e}"))
        .map(|_| out)
}

#[test]
fn a_superseded_record_is_not_served_after_its_successor_is_reclaimed_and_the_store_restarts() {
    let io = FaultIo::new();
    let store = open_with(&io, bounded());
    let v1 = payload(1, K, LEN);
    let v2 = payload(2, K, LEN);
    store
        .put(&[(meta(K), v1.as_slice())])
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(get(&store, K).as_deref(), Some(v1.as_slice()));
    // Unread records push K's probation segment out: K, read, moves to the main log.
    let mut next = 1u64;
    while store.stats().reinserted_records == 0 {
        store
            .put(&[(meta(next), payload(1, next, LEN).as_slice())])
            .unwrap_or_else(|e| panic!("{e}"));
        next += 1;
    }
    // The new version goes to probation; the old one stays in the main log, dead.
    store
        .put(&[(meta(K), v2.as_slice())])
        .unwrap_or_else(|e| panic!("{e}"));
    let reclaimed = store.stats().reclaimed_segments;
    // More unread records push v2's probation segment out; the main log is left alone.
    for _ in 0..400 {
        store
            .put(&[(meta(next), payload(1, next, LEN).as_slice())])
            .unwrap_or_else(|e| panic!("{e}"));
        next += 1;
    }
    assert!(store.stats().reclaimed_segments > reclaimed + 10);
    assert_eq!(get(&store, K).as_deref(), Some(v2.as_slice()));
    drop(store);

    let dyn_io: Arc<dyn Io> = Arc::new(io.clone());
    let store = StateStore::open(dyn_io, bounded()).unwrap_or_else(|e| panic!("{e}"));
    let after = get(&store, K);
    assert!(
        after.as_deref() != Some(v1.as_slice()),
        "the superseded record came back after a restart"
    );
    assert_eq!(after.as_deref(), Some(v2.as_slice()));
}
