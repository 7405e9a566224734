//! With manual durability, small bundles wait in the active segment's write-behind tail and are
//! written together: they are readable at once, written by a sync (or once the tail is full,
//! or when the store is dropped), lost only with what else was unsynced when the machine goes
//! down, and never read back as other bytes while the tail is being written.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use common::*;
use orbitkv_store::Durability;
use orbitkv_store::io::fault::{Crash, FaultIo};

const LEN: usize = 20_000;

#[test]
fn small_puts_are_readable_at_once_and_written_together_by_a_sync() {
    let io = FaultIo::new();
    let store = open(&io, 64 << 20, Durability::Manual);
    let before = io.counters().bytes_written;
    put_range(&store, 1, 0, 20, LEN);
    // Twenty 20 KB bundles: still in the tail, none written.
    assert!(io.counters().bytes_written - before < LEN as u64);
    for i in 0..20 {
        assert_eq!(
            check(&store, 1, i, LEN),
            Some(true),
            "record {i} from the tail"
        );
    }
    let writes = io.counters().writes;
    store.sync().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        io.counters().writes - writes,
        1,
        "one write for the whole tail"
    );
    assert!(io.counters().bytes_written - before >= 20 * LEN as u64);
    for i in 0..20 {
        assert_eq!(
            check(&store, 1, i, LEN),
            Some(true),
            "record {i} from the file"
        );
    }
    // Synced ones survive a power loss; unsynced ones in the tail go with it.
    put_range(&store, 1, 20, 25, LEN);
    io.crash(Crash::DropUnsynced);
    drop(store);
    let store = open(&io, 64 << 20, Durability::Manual);
    for i in 0..20 {
        assert_eq!(check(&store, 1, i, LEN), Some(true), "synced record {i}");
    }
    for i in 20..25 {
        assert_eq!(check(&store, 1, i, LEN), None, "unsynced record {i}");
    }
}

#[test]
fn a_full_tail_is_written_without_a_sync_and_a_drop_writes_the_rest() {
    let io = FaultIo::new();
    let store = open(&io, 64 << 20, Durability::Manual);
    let before = io.counters().bytes_written;
    // 3 MiB of small bundles: the tail fills (2 MiB) and is written once.
    put_range(&store, 2, 0, 150, LEN);
    let written = io.counters().bytes_written - before;
    assert!(
        written >= 2 << 20 && written < 150 * LEN as u64,
        "{written}"
    );
    drop(store);
    assert!(io.counters().bytes_written - before >= 150 * LEN as u64);
    // Not synced, but written: a process restart (no power loss) keeps everything.
    let store = open(&io, 64 << 20, Durability::Manual);
    for i in 0..150 {
        assert_eq!(check(&store, 2, i, LEN), Some(true), "record {i}");
    }
}

#[test]
fn readers_racing_the_tail_being_written_never_see_other_bytes() {
    let io = FaultIo::new();
    let store = Arc::new(open(&io, 1 << 20, Durability::Manual));
    let done = Arc::new(AtomicU64::new(0));
    let writer = {
        let (store, done) = (store.clone(), done.clone());
        std::thread::spawn(move || {
            for i in 0..600u64 {
                let p = payload(3, i, 3000 + (i as usize % 7) * 1000);
                store
                    .put(&[(meta(i), p.as_slice())])
                    .unwrap_or_else(|e| panic!("{e}"));
                done.store(i + 1, Ordering::Release);
                if i % 97 == 0 {
                    store.sync().unwrap_or_else(|e| panic!("{e}"));
                }
            }
        })
    };
    let mut reads = 0u64;
    let read_latest = |reads: &mut u64| {
        let n = done.load(Ordering::Acquire);
        for i in n.saturating_sub(40)..n {
            let len = 3000 + (i as usize % 7) * 1000;
            // Everything put so far is found (nothing is evicted here) and exact.
            assert_eq!(check(&store, 3, i, len), Some(true), "record {i}");
            *reads += 1;
        }
    };
    while !writer.is_finished() {
        read_latest(&mut reads);
    }
    writer.join().unwrap_or_else(|_| panic!("writer panicked"));
    // A writer that finished before the first read (a loaded machine) still leaves the
    // records to check.
    read_latest(&mut reads);
    assert!(reads > 0);
    assert_eq!(store.stats().checksum_failures, 0);
}
