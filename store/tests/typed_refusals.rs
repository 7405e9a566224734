//! Every write refusal says whether and when to try again: no space (and a full SSD tier) are
//! retried after a delay, a failed write is retried at once on a new segment, a read-only
//! store, a failed manifest checkpoint, a full disk at open and a sequence on disk past any the
//! store writes refuse for good, and a record the format cannot carry or a namespace never
//! registered is rejected alone.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use orbitkv_state::Namespace;
use orbitkv_store::io::Io;
use orbitkv_store::io::fault::{FaultIo, FaultPlan};
use orbitkv_store::{Durability, Error, NO_SPACE_RETRY, Retry, StateStore, WriteRefusal};

fn put(store: &StateStore, i: u64, len: usize) -> Result<(), Error> {
    let p = payload(1, i, len);
    store.put(&[(meta(i), p.as_slice())]).map(|_| ())
}

#[test]
fn no_space_is_retried_after_a_delay() {
    let io = FaultIo::new();
    let store = open(&io, 1 << 20, Durability::EveryPut);
    put(&store, 0, 1000).unwrap();
    io.set_plan(FaultPlan {
        space_bytes: Some(0),
        ..Default::default()
    });
    // The write that meets the full disk, then the refusals while the delay runs.
    let first = put(&store, 1, 1000).unwrap_err();
    assert_eq!(first.retry(), Retry::After(NO_SPACE_RETRY), "{first}");
    let then = put(&store, 2, 1000).unwrap_err();
    match &then {
        Error::WritesRefused(WriteRefusal::NoSpace { retry_after }) => {
            assert!(*retry_after <= NO_SPACE_RETRY && !retry_after.is_zero());
            assert_eq!(then.retry(), Retry::After(*retry_after));
        }
        other => panic!("not a no-space refusal: {other}"),
    }
    assert!(then.to_string().contains("no space"), "{then}");
}

#[test]
fn a_failed_write_is_retried_at_once_on_a_new_segment() {
    let io = FaultIo::new();
    let store = open(&io, 1 << 20, Durability::EveryPut);
    put(&store, 0, 1000).unwrap();
    io.set_plan(FaultPlan {
        fail_write: Some(1),
        ..Default::default()
    });
    let e = put(&store, 1, 1000).unwrap_err();
    assert!(matches!(e.retry(), Retry::After(_)), "{e}");
    put(&store, 1, 1000).unwrap();
    assert_eq!(check(&store, 1, 1, 1000), Some(true));
}

#[test]
fn a_full_ssd_tier_is_retried_after_a_delay() {
    let e = Error::CapacityExhausted {
        need: 10,
        used: 100,
        budget: 100,
    };
    assert!(matches!(e.retry(), Retry::After(d) if d > Duration::ZERO));
}

#[test]
fn a_read_only_store_refuses_for_good_and_still_serves() {
    let io = FaultIo::new();
    let store = open(&io, 1 << 20, Durability::EveryPut);
    put(&store, 0, 1000).unwrap();
    drop(store);
    let mut cfg = config(1 << 20, Durability::EveryPut);
    cfg.read_only = true;
    // Registered already: accepted, so the namespace's records can be served.
    let store = open_with(&io, cfg);
    let mut out = Vec::new();
    assert!(store.get(&key(0), &mut out).unwrap().is_some());
    assert_eq!(out, payload(1, 0, 1000));
    let e = put(&store, 1, 1000).unwrap_err();
    assert!(
        matches!(e, Error::WritesRefused(WriteRefusal::ReadOnly)),
        "{e}"
    );
    assert_eq!(e.retry(), Retry::Never);
    let e = store
        .register_namespace(Namespace([0x55; 32]), info())
        .unwrap_err();
    assert_eq!(e.retry(), Retry::Never, "{e}");
    assert_eq!(
        store.retire_namespace(NS).unwrap_err().retry(),
        Retry::Never
    );
}

#[test]
fn a_failed_checkpoint_refuses_for_good() {
    // Fail each directory sync in turn (segment creations and checkpoints both sync the
    // directory); wherever a checkpoint's fails, the store refuses for good from then on.
    let mut refused_for_good = 0;
    for k in 1..12u64 {
        let io = FaultIo::new();
        let mut cfg = config(8 << 10, Durability::EveryPut);
        cfg.checkpoint_every = 4;
        let store = open_with(&io, cfg);
        io.set_plan(FaultPlan {
            fail_sync_dir: Some(k),
            ..Default::default()
        });
        for i in 0..20 {
            let _ = put(&store, i, 3000);
        }
        if let Err(e) = put(&store, 1000, 10)
            && matches!(
                e,
                Error::WritesRefused(WriteRefusal::CheckpointFailed { .. })
            )
        {
            assert_eq!(e.retry(), Retry::Never);
            assert_eq!(put(&store, 1001, 10).unwrap_err().retry(), Retry::Never);
            refused_for_good += 1;
        }
    }
    assert!(
        refused_for_good > 0,
        "no directory sync failed a checkpoint"
    );
}

#[test]
fn a_full_disk_at_open_refuses_for_good() {
    let io = FaultIo::new();
    let store = open(&io, 1 << 20, Durability::EveryPut);
    put(&store, 0, 1000).unwrap();
    drop(store); // active: sealing it on open needs space
    io.set_plan(FaultPlan {
        space_bytes: Some(0),
        ..Default::default()
    });
    let store = StateStore::open(
        Arc::new(io.clone()) as Arc<dyn Io>,
        config(1 << 20, Durability::EveryPut),
    )
    .unwrap();
    let e = put(&store, 1, 10).unwrap_err();
    assert!(
        matches!(
            e,
            Error::WritesRefused(WriteRefusal::RecoveryUnsealed { .. })
        ),
        "{e}"
    );
    assert_eq!(e.retry(), Retry::Never);
}

#[test]
fn a_record_that_cannot_be_stored_is_rejected_alone() {
    let io = FaultIo::new();
    let store = open(&io, 1 << 20, Durability::EveryPut);
    let p = payload(1, 0, 10);
    let unknown = store
        .put(&[(meta_in(Namespace([0x99; 32]), 0), p.as_slice())])
        .unwrap_err();
    assert_eq!(unknown.retry(), Retry::Rejected, "{unknown}");
    let huge = vec![0u8; orbitkv_segments::MAX_PAYLOAD_LEN + 1];
    let e = store.put(&[(meta(0), huge.as_slice())]).unwrap_err();
    assert_eq!(e.retry(), Retry::Rejected, "{e}");
    // The store itself takes writes.
    put(&store, 0, 10).unwrap();
}

#[test]
fn a_sequence_past_any_the_store_writes_refuses_writes_and_still_serves() {
    use orbitkv_wal::{ManifestRecord, encode_record};
    for claimed in [orbitkv_store::SEQUENCE_LIMIT, u64::MAX] {
        let io = FaultIo::new();
        let store = open(&io, 1 << 20, Durability::EveryPut);
        put(&store, 0, 1000).unwrap();
        // Dropped without closing: its segment stays active, to be sealed at the next open.
        drop(store);
        // A well-formed manifest record (checksums and all) that claims the sequence.
        let manifest = std::path::Path::new("data/manifest.log");
        let mut bytes = io.read_file(manifest).unwrap();
        let record = ManifestRecord::NamespaceRegistered {
            namespace: Namespace([0x66; 32]),
            info: info(),
        };
        encode_record(claimed, &record, &mut bytes).unwrap();
        assert!(io.write_file(manifest, &bytes));
        let store = StateStore::open(
            Arc::new(io.clone()) as Arc<dyn Io>,
            config(1 << 20, Durability::EveryPut),
        )
        .unwrap();
        let mut out = Vec::new();
        assert!(store.get(&key(0), &mut out).unwrap().is_some());
        assert_eq!(out, payload(1, 0, 1000));
        let e = put(&store, 1, 1000).unwrap_err();
        assert!(
            matches!(e, Error::WritesRefused(WriteRefusal::SequencesExhausted { highest }) if highest == claimed),
            "{e}"
        );
        assert_eq!(e.retry(), Retry::Never);
        // Nothing was written under a sequence past the limit: the active segment stays active.
        drop(store);
        assert_eq!(io.read_file(manifest).unwrap(), bytes);
    }
}
