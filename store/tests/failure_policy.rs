//! The documented failure policy, exactly: ENOSPC refuses puts (until space comes back) and keeps
//! serving reads; a failed
//! fsync drops (and counts) the records since the last good sync and seals the segment off; a
//! failed write is refused and the next put uses a new segment; nothing wrong is ever served.

mod common;

use common::*;
use orbitkv_store::io::fault::{Crash, FaultIo, FaultPlan};
use orbitkv_store::{Durability, Error};

#[test]
fn no_space_refuses_puts_and_keeps_serving_reads() {
    let io = FaultIo::new();
    let store = open(&io, 1 << 20, Durability::EveryPut);
    put_range(&store, 2, 0, 5, 10_000);
    io.set_plan(FaultPlan {
        space_bytes: Some(25_000),
        ..Default::default()
    });
    let mut accepted = 5;
    let mut refused = 0;
    for i in 5..15 {
        let p = payload(2, i, 10_000);
        match store.put(&[(meta(i), p.as_slice())]) {
            Ok(_) => accepted += 1,
            Err(_) => refused += 1,
        }
    }
    assert!(refused > 0 && accepted < 15);
    let s = store.stats();
    assert_eq!(s.refused_puts, refused);
    // After the first refusal every put is refused, with a clear reason.
    let p = payload(2, 99, 10);
    let err = store.put(&[(meta(99), p.as_slice())]).unwrap_err();
    assert!(matches!(err, Error::WritesRefused { .. }), "{err}");
    assert!(err.to_string().contains("no space"), "{err}");
    for i in 0..accepted {
        assert_eq!(check(&store, 2, i, 10_000), Some(true), "record {i}");
    }
    // Space freed: once the retry interval has passed, puts are accepted again.
    io.set_plan(FaultPlan::default());
    std::thread::sleep(orbitkv_store::NO_SPACE_RETRY + std::time::Duration::from_millis(50));
    let p = payload(2, 100, 10_000);
    store.put(&[(meta(100), p.as_slice())]).unwrap();
    assert_eq!(check(&store, 2, 100, 10_000), Some(true));
}

#[test]
fn a_failed_fsync_loses_exactly_the_unsynced_records() {
    let io = FaultIo::new();
    let store = open(&io, 1 << 20, Durability::Manual);
    put_range(&store, 3, 0, 4, 500);
    store.sync().unwrap();
    put_range(&store, 3, 4, 9, 500);
    io.set_plan(FaultPlan {
        fail_sync: Some(1),
        ..Default::default()
    });
    assert!(store.sync().is_err());
    assert_eq!(store.stats().lost_records, 5);
    for i in 4..9 {
        assert_eq!(
            check(&store, 3, i, 500),
            None,
            "lost record {i} is not served"
        );
    }
    for i in 0..4 {
        assert_eq!(check(&store, 3, i, 500), Some(true));
    }
    // The next put goes to a new segment and is durable.
    put_range(&store, 3, 20, 21, 500);
    store.sync().unwrap();
    assert!(store.segments().len() >= 2);
    drop(store);
    io.crash(Crash::DropUnsynced);
    let store = open(&io, 1 << 20, Durability::Manual);
    for i in 0..4 {
        assert_eq!(check(&store, 3, i, 500), Some(true));
    }
    assert_eq!(check(&store, 3, 20, 500), Some(true));
    for i in 4..9 {
        // Their fsync failed, so no later sync made them durable: gone after power loss.
        assert_eq!(
            check(&store, 3, i, 500),
            None,
            "lost record {i} after the crash"
        );
    }
}

#[test]
fn a_failed_write_is_refused_and_the_next_put_uses_a_new_segment() {
    let io = FaultIo::new();
    let store = open(&io, 1 << 20, Durability::EveryPut);
    put_range(&store, 4, 0, 3, 700);
    io.set_plan(FaultPlan {
        fail_write: Some(1),
        ..Default::default()
    });
    let p = payload(4, 3, 700);
    assert!(store.put(&[(meta(3), p.as_slice())]).is_err());
    assert_eq!(store.stats().refused_puts, 1);
    assert_eq!(check(&store, 4, 3, 700), None);
    put_range(&store, 4, 4, 6, 700);
    for i in [0, 1, 2, 4, 5] {
        assert_eq!(check(&store, 4, i, 700), Some(true), "record {i}");
    }
}
