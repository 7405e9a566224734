//! With manual durability, large bundles are written asynchronously (several writes in flight,
//! so a putter encodes its next bundle while the device takes the previous ones): a record is
//! readable from its write's buffer while the file does not yet have it, a write that fails in
//! flight loses only what was unsynced (counted, never served as other bytes), and a power loss
//! with writes in flight keeps everything synced before it.

mod common;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use common::*;
use orbitkv_store::io::fault::{Crash, FaultIo, FaultPlan};
use orbitkv_store::io::{self as store_io, Io};
use orbitkv_store::{Durability, StateStore, StoreConfig};

/// Large enough to skip the write-behind tail.
const LEN: usize = 3 << 19;

fn deferred(io: &FaultIo) {
    io.set_plan(FaultPlan {
        defer_writes: true,
        ..FaultPlan::default()
    });
}

fn segment_bytes_on_disk(io: &FaultIo, store: &StateStore) -> u64 {
    store
        .segments()
        .iter()
        .filter_map(|(id, _)| {
            let p = Path::new("data/segments").join(format!("{id:08x}.seg"));
            io.read_file(&p).map(|b| b.len() as u64)
        })
        .sum()
}

#[test]
fn records_in_flight_are_read_from_their_buffers_and_written_by_a_sync() {
    let io = FaultIo::new();
    let store = open(&io, 256 << 20, Durability::Manual);
    deferred(&io);
    put_range(&store, 1, 0, 3, LEN);
    // Three writes in flight: the file has none of them yet.
    assert!(
        segment_bytes_on_disk(&io, &store) < LEN as u64,
        "the writes were not left in flight"
    );
    for i in 0..3 {
        assert_eq!(check(&store, 1, i, LEN), Some(true), "record {i} in flight");
    }
    // More than the writes kept in flight: the oldest complete to make room.
    put_range(&store, 1, 3, 12, LEN);
    let on_disk = segment_bytes_on_disk(&io, &store);
    assert!(
        on_disk >= 8 * LEN as u64 && on_disk < 12 * LEN as u64,
        "{on_disk}"
    );
    for i in 0..12 {
        assert_eq!(check(&store, 1, i, LEN), Some(true), "record {i}");
    }
    store.sync().unwrap_or_else(|e| panic!("{e}"));
    assert!(segment_bytes_on_disk(&io, &store) >= 12 * LEN as u64);
    // Synced: they survive a power loss.
    io.crash(Crash::DropUnsynced);
    drop(store);
    let store = open(&io, 256 << 20, Durability::Manual);
    for i in 0..12 {
        assert_eq!(check(&store, 1, i, LEN), Some(true), "synced record {i}");
    }
}

#[test]
fn a_write_failing_in_flight_loses_only_the_unsynced_records() {
    let io = FaultIo::new();
    let store = open(&io, 256 << 20, Durability::Manual);
    put_range(&store, 2, 0, 4, LEN);
    store.sync().unwrap_or_else(|e| panic!("{e}"));
    // The second deferred write fails when it completes, after its put was accepted.
    io.set_plan(FaultPlan {
        defer_writes: true,
        fail_write: Some(2),
        ..FaultPlan::default()
    });
    put_range(&store, 2, 4, 7, LEN);
    for i in 4..7 {
        assert_eq!(check(&store, 2, i, LEN), Some(true), "record {i} in flight");
    }
    let err = store
        .sync()
        .expect_err("the failed write must fail the sync");
    assert!(err.to_string().contains("write"), "{err}");
    // The unsynced records are gone (counted), the synced ones still served; none differs.
    assert_eq!(store.stats().lost_records, 3);
    for i in 0..4 {
        assert_eq!(check(&store, 2, i, LEN), Some(true), "synced record {i}");
    }
    for i in 4..7 {
        assert_eq!(check(&store, 2, i, LEN), None, "lost record {i}");
    }
    // The store goes on in a new segment, and a restart agrees.
    io.set_plan(FaultPlan::default());
    put_range(&store, 2, 7, 9, LEN);
    store.sync().unwrap_or_else(|e| panic!("{e}"));
    drop(store);
    let store = open(&io, 256 << 20, Durability::Manual);
    for i in (0..4).chain(7..9) {
        assert_eq!(
            check(&store, 2, i, LEN),
            Some(true),
            "record {i} after restart"
        );
    }
    for i in 4..7 {
        assert_eq!(
            check(&store, 2, i, LEN),
            None,
            "lost record {i} after restart"
        );
    }
    assert_eq!(store.stats().checksum_failures, 0);
}

#[test]
fn a_power_loss_with_writes_in_flight_keeps_what_was_synced() {
    let io = FaultIo::new();
    let store = open(&io, 256 << 20, Durability::Manual);
    deferred(&io);
    put_range(&store, 3, 0, 5, LEN);
    store.sync().unwrap_or_else(|e| panic!("{e}"));
    put_range(&store, 3, 5, 8, LEN);
    io.crash(Crash::DropUnsynced);
    drop(store);
    io.set_plan(FaultPlan::default());
    let store = open(&io, 256 << 20, Durability::Manual);
    for i in 0..5 {
        assert_eq!(check(&store, 3, i, LEN), Some(true), "synced record {i}");
    }
    for i in 5..8 {
        assert_eq!(
            check(&store, 3, i, LEN),
            None,
            "record {i} was never written"
        );
    }
}

/// The real backend as the store picks it (io_uring, with O_DIRECT where the file system takes
/// it): readers race the writes in flight.
#[test]
fn readers_racing_writes_in_flight_never_see_other_bytes() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let (io, direct) = default_backend(dir.path());
    let alignment = if direct {
        orbitkv_segments::Alignment::Direct
    } else {
        orbitkv_segments::Alignment::Packed
    };
    race(io, alignment, &dir.path().join("data"));
}

/// The same through the page cache (io_uring without O_DIRECT, packed frames).
#[test]
fn readers_racing_buffered_writes_in_flight_never_see_other_bytes() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    uring_or_skip("buffered writes in flight");
    let io: Arc<dyn Io> = Arc::new(store_io::uring::UringIo::buffered());
    race(
        io,
        orbitkv_segments::Alignment::Packed,
        &dir.path().join("data"),
    );
}

fn race(io: Arc<dyn Io>, alignment: orbitkv_segments::Alignment, data: &Path) {
    let mut c = StoreConfig::new(data);
    c.segment_bytes = 64 << 20;
    c.durability = Durability::Manual;
    c.alignment = alignment;
    let store = Arc::new(StateStore::open(io.clone(), c.clone()).unwrap_or_else(|e| panic!("{e}")));
    store
        .register_namespace(NS, info())
        .unwrap_or_else(|e| panic!("{e}"));
    let len = |i: u64| (1 << 20) + (i as usize % 5) * 100_000;
    let done = Arc::new(AtomicU64::new(0));
    let total = 120u64;
    let writer = {
        let (store, done) = (store.clone(), done.clone());
        std::thread::spawn(move || {
            for i in 0..total {
                let p = payload(4, i, len(i));
                store
                    .put(&[(meta(i), p.as_slice())])
                    .unwrap_or_else(|e| panic!("{e}"));
                done.store(i + 1, Ordering::Release);
                if i % 41 == 40 {
                    store.sync().unwrap_or_else(|e| panic!("{e}"));
                }
            }
        })
    };
    let mut reads = 0u64;
    while !writer.is_finished() {
        let n = done.load(Ordering::Acquire);
        for i in n.saturating_sub(6)..n {
            assert_eq!(check(&store, 4, i, len(i)), Some(true), "record {i}");
            reads += 1;
        }
    }
    writer.join().unwrap_or_else(|_| panic!("writer panicked"));
    assert!(reads > 0);
    assert_eq!(store.stats().checksum_failures, 0);
    // Everything was written (segments sealed on rotation wait for their writes; the drop of
    // the store waits for the rest): a restart finds all of it.
    drop(Arc::into_inner(store).unwrap_or_else(|| panic!("store still shared")));
    let store = StateStore::open(io, c).unwrap_or_else(|e| panic!("{e}"));
    for i in 0..total {
        assert_eq!(
            check(&store, 4, i, len(i)),
            Some(true),
            "record {i} after restart"
        );
    }
}

#[test]
fn a_full_disk_found_by_a_later_put_loses_the_unsynced_records_and_says_so() {
    let io = FaultIo::new();
    let store = open(&io, 256 << 20, Durability::Manual);
    put_range(&store, 3, 0, 2, LEN);
    store.sync().unwrap_or_else(|e| panic!("{e}"));
    // The disk fills up under the writes in flight: the third one fails with ENOSPC when it
    // completes, which a later put finds while making room for its own.
    io.set_plan(FaultPlan {
        defer_writes: true,
        space_bytes: Some(2 * LEN as u64 + (LEN as u64) / 2),
        ..FaultPlan::default()
    });
    let mut accepted = Vec::new();
    let mut refused = 0;
    for i in 2..12 {
        let p = payload(3, i, LEN);
        match store.put(&[(meta(i), p.as_slice())]) {
            Ok(_) => accepted.push(i),
            Err(_) => refused += 1,
        }
    }
    assert!(refused > 0, "no put found the full disk");
    // Accepted puts the failed write held are lost: the sync must not call them durable.
    let synced = store.sync();
    assert!(synced.is_err(), "a sync after a lost write succeeded");
    for i in 0..12 {
        assert_ne!(check(&store, 3, i, LEN), Some(false), "record {i} differs");
    }
    // Space comes back: what a sync then confirms survives a power loss.
    io.set_plan(FaultPlan::default());
    std::thread::sleep(orbitkv_store::NO_SPACE_RETRY);
    put_range(&store, 3, 12, 14, LEN);
    store.sync().unwrap_or_else(|e| panic!("{e}"));
    let served: Vec<u64> = (0..14)
        .filter(|&i| check(&store, 3, i, LEN) == Some(true))
        .collect();
    io.crash(Crash::DropUnsynced);
    drop(store);
    let store = open(&io, 256 << 20, Durability::Manual);
    for i in served {
        assert_eq!(
            check(&store, 3, i, LEN),
            Some(true),
            "record {i}, served after a good sync, is gone after a power loss"
        );
    }
    assert_eq!(store.stats().checksum_failures, 0);
}
