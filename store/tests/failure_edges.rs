//! Failure edges: a transient error while opening never deletes data; a failed directory fsync
//! of a checkpoint stops writes instead of losing records; a failed sync while sealing, or of a
//! newer version, keeps the policy (the unsynced are lost, the older durable version returns); a
//! read error on the active segment moves writes to a new segment; a bad bundle writes nothing;
//! segment ids are never reused; a full disk at open still serves reads; a segment that cannot
//! be started is neither listed nor left on disk.

mod common;

use std::sync::Arc;

use common::*;
use orbitkv_segments::RecordMeta;
use orbitkv_state::FormatDigest;
use orbitkv_store::io::Io;
use orbitkv_store::io::fault::{Crash, FaultIo, FaultPlan};
use orbitkv_store::{Durability, Error, StateStore};

#[test]
fn a_transient_open_error_refuses_to_open_and_deletes_nothing() {
    let io = FaultIo::new();
    let s = open(&io, 1 << 20, Durability::EveryPut);
    put_range(&s, 1, 0, 3, 500);
    drop(s); // the segment stays active
    io.set_plan(FaultPlan {
        fail_opens_of: Some(".seg".into()),
        ..Default::default()
    });
    let r = StateStore::open(
        Arc::new(io.clone()) as Arc<dyn Io>,
        config(1 << 20, Durability::EveryPut),
    );
    assert!(matches!(r, Err(Error::Io { .. })));
    io.set_plan(FaultPlan::default());
    let s = open(&io, 1 << 20, Durability::EveryPut);
    for i in 0..3 {
        assert_eq!(check(&s, 1, i, 500), Some(true), "record {i}");
    }
}

#[test]
fn a_failed_checkpoint_directory_sync_refuses_writes_and_loses_nothing() {
    let mk = |io: &FaultIo| {
        let mut c = config(8 << 10, Durability::EveryPut);
        c.checkpoint_every = 4;
        let s = StateStore::open(Arc::new(io.clone()) as Arc<dyn Io>, c).unwrap();
        s.register_namespace(NS, info()).unwrap();
        s
    };
    // Fail each directory sync in turn; whatever fails, acknowledged records survive a crash.
    for k in 1..12u64 {
        let io = FaultIo::new();
        let s = mk(&io);
        io.set_plan(FaultPlan {
            fail_sync_dir: Some(k),
            ..Default::default()
        });
        let mut durable = Vec::new();
        for i in 0..20 {
            let p = payload(2, i, 3000);
            if s.put(&[(meta(i), p.as_slice())]).is_ok() {
                durable.push(i);
            }
        }
        // A retirement is refused while writes are (its record could vanish with an
        // undurable manifest rename); one that succeeds holds after a crash.
        let retired = s.retire_namespace(NS).is_ok();
        drop(s);
        io.crash(Crash::DropUnsynced);
        let s = mk(&io);
        for &i in &durable {
            let expected = if retired { None } else { Some(true) };
            assert_eq!(
                check(&s, 2, i, 3000),
                expected,
                "dir sync {k}: record {i} (retired: {retired})"
            );
        }
    }
}

#[test]
fn a_failed_sync_while_sealing_keeps_the_policy() {
    let io = FaultIo::new();
    let s = open(&io, 16 << 10, Durability::Manual);
    put_range(&s, 3, 0, 2, 4000);
    s.sync().unwrap();
    put_range(&s, 3, 2, 3, 4000); // unsynced
    // The next put seals the segment; its sync fails.
    let syncs_before_seal = 1;
    io.set_plan(FaultPlan {
        fail_sync: Some(syncs_before_seal),
        ..Default::default()
    });
    let p = payload(3, 3, 9000);
    assert!(s.put(&[(meta(3), p.as_slice())]).is_err());
    assert_eq!(s.stats().lost_records, 1);
    assert_eq!(
        check(&s, 3, 2, 4000),
        None,
        "the unsynced record is not served"
    );
    for i in 0..2 {
        assert_eq!(check(&s, 3, i, 4000), Some(true));
    }
}

#[test]
fn a_lost_newer_version_brings_back_the_durable_one() {
    let io = FaultIo::new();
    let s = open(&io, 1 << 20, Durability::Manual);
    let v1 = payload(4, 0, 800);
    s.put(&[(meta(0), v1.as_slice())]).unwrap();
    s.sync().unwrap();
    let v2 = payload(4, 0, 801);
    s.put(&[(meta(0), v2.as_slice())]).unwrap();
    io.set_plan(FaultPlan {
        fail_sync: Some(1),
        ..Default::default()
    });
    assert!(s.sync().is_err());
    let mut out = Vec::new();
    assert!(s.get(&key(0), &mut out).unwrap().is_some());
    assert_eq!(out, v1, "the durable version is served again");
}

#[test]
fn a_read_error_on_the_active_segment_moves_writes_to_a_new_one() {
    let io = FaultIo::new();
    let s = open(&io, 1 << 20, Durability::EveryPut);
    put_range(&s, 5, 0, 2, 300);
    io.set_plan(FaultPlan {
        fail_reads_of: Some("00000001.seg".into()),
        ..Default::default()
    });
    assert_eq!(check(&s, 5, 0, 300), None);
    io.set_plan(FaultPlan::default());
    put_range(&s, 5, 10, 12, 300);
    for i in 10..12 {
        assert_eq!(
            check(&s, 5, i, 300),
            Some(true),
            "record {i} in the new segment"
        );
    }
    // A restart clears the quarantine: the bytes are fine, so they are served again.
    drop(s);
    let s = open(&io, 1 << 20, Durability::EveryPut);
    for i in [0, 1, 10, 11] {
        assert_eq!(check(&s, 5, i, 300), Some(true), "record {i} after restart");
    }
}

#[test]
fn a_bundle_with_one_bad_record_writes_none_of_it() {
    let io = FaultIo::new();
    let s = open(&io, 1 << 20, Durability::EveryPut);
    put_range(&s, 6, 0, 1, 100);
    let good = meta(1);
    let mut bad = meta(2);
    bad.format = FormatDigest([9; 32]); // another format for the same group and rank
    let p = payload(6, 1, 100);
    let bundle: Vec<(RecordMeta, &[u8])> = vec![(good, p.as_slice()), (bad, p.as_slice())];
    assert!(matches!(s.put(&bundle), Err(Error::BadBundle(_))));
    assert_eq!(
        check(&s, 6, 1, 100),
        None,
        "nothing of the bundle was written"
    );
    drop(s);
    let s = open(&io, 1 << 20, Durability::EveryPut);
    assert_eq!(check(&s, 6, 1, 100), None);
}

#[test]
fn segment_ids_are_never_reused() {
    let io = FaultIo::new();
    let s = open(&io, 1 << 20, Durability::EveryPut);
    put_range(&s, 7, 0, 1, 100);
    let first: Vec<u64> = s.segments().iter().map(|x| x.0).collect();
    drop(s);
    // Reopening seals segment 1; a fresh put creates a new one with a larger id.
    let s = open(&io, 1 << 20, Durability::EveryPut);
    put_range(&s, 7, 1, 2, 100);
    let ids: Vec<u64> = s.segments().iter().map(|x| x.0).collect();
    assert!(ids.iter().max() > first.iter().max());
    assert!(ids.windows(2).all(|w| w[0] < w[1]));
}

#[test]
fn a_full_disk_at_open_still_serves_reads() {
    let io = FaultIo::new();
    let s = open(&io, 1 << 20, Durability::EveryPut);
    put_range(&s, 8, 0, 4, 1000);
    drop(s); // active: sealing it on open needs space
    io.set_plan(FaultPlan {
        space_bytes: Some(0),
        ..Default::default()
    });
    let s = StateStore::open(
        Arc::new(io.clone()) as Arc<dyn Io>,
        config(1 << 20, Durability::EveryPut),
    )
    .unwrap();
    for i in 0..4 {
        assert_eq!(check(&s, 8, i, 1000), Some(true));
    }
    let p = payload(8, 9, 10);
    assert!(matches!(
        s.put(&[(meta(9), p.as_slice())]),
        Err(Error::WritesRefused { .. })
    ));
}

#[test]
fn a_segment_that_cannot_be_started_is_not_left_behind() {
    let io = FaultIo::new();
    let s = open(&io, 1 << 20, Durability::EveryPut);
    put_range(&s, 9, 0, 2, 1000);
    drop(s);
    // Reopened: its first put starts a segment, and every try fails to make the file.
    let s = open(&io, 1 << 20, Durability::EveryPut);
    let listed = |s: &StateStore| -> Vec<u64> {
        s.segment_stats().unwrap().iter().map(|st| st.id).collect()
    };
    let before = listed(&s);
    let manifest = s.manifest_len();
    for i in 2..12 {
        // The segment's creation is listed (write 1), its header write fails (write 2).
        io.set_plan(FaultPlan {
            fail_write: Some(2),
            ..Default::default()
        });
        let p = payload(9, i, 1000);
        assert!(s.put(&[(meta(i), p.as_slice())]).is_err(), "put {i}");
    }
    io.set_plan(FaultPlan::default());
    assert_eq!(listed(&s), before, "segments not started stay listed");
    let files = io.list_dir(std::path::Path::new("data/segments")).unwrap();
    assert_eq!(files.len(), before.len(), "{files:?}");
    drop(s);
    // A restart finds nothing to clean up: the manifest names no segment without its file.
    let s = open(&io, 1 << 20, Durability::EveryPut);
    assert!(s.manifest_len() > manifest);
    assert_eq!(listed(&s), before);
    put_range(&s, 9, 12, 14, 1000);
    drop(s);
    let s = open(&io, 1 << 20, Durability::EveryPut);
    for i in (0..2).chain(12..14) {
        assert_eq!(check(&s, 9, i, 1000), Some(true), "record {i}");
    }
}
