//! Regression for LMCache #4991 (a cache that served gibberish from a store whose write had
//! failed), through the daemon: a Publish whose write fails — EIO, ENOSPC, a failed fsync, on
//! the fault backend — is answered with a retryable status and is never visible to Query, not
//! even for a moment (a second client queries without pause the whole time). Once the fault is
//! gone, publishing the page again makes it visible.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use common::pages::{fill, hash, publish, publish_replies, publish_request, register_pool};
use common::{Daemon, fault_store, seal};
use orbitkv_protocol::client::{Answer, Client};
use orbitkv_protocol::{Message, PageStatus};
use orbitkv_sim::SimInstance;
use orbitkv_store::io::fault::{FaultIo, FaultPlan};

fn a_failed_publish_is_never_visible(fault: FaultPlan) {
    let io = FaultIo::new();
    let d = Daemon::on(fault_store(&io, false));
    let sim = SimInstance::new("lmcache-4991", 1);
    let mut s = seal(&d, &sim);
    let pool = register_pool(&mut s, &sim);
    let p0 = fill(&sim, &pool, 0, 0);
    assert_eq!(publish(&mut s, &sim, &[(0, p0)]), vec![PageStatus::Ok]);
    // Another client asks, without pause, how far blocks 0 and 1 are proven.
    let stop = Arc::new(AtomicBool::new(false));
    let (seen, queries) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let q = common::query(&s, vec![hash(0), hash(1)], 32);
    let querier = {
        let (stop, seen, queries, socket) = (
            stop.clone(),
            seen.clone(),
            queries.clone(),
            d.socket.clone(),
        );
        std::thread::spawn(move || {
            let mut c = Client::connect(&socket).unwrap_or_else(|e| panic!("{e}"));
            while !stop.load(Ordering::Acquire) {
                if let Answer::Proof(p) = c.query(q.clone()).unwrap_or_else(|e| panic!("{e}")) {
                    seen.fetch_max(p.boundary, Ordering::Relaxed);
                }
                queries.fetch_add(1, Ordering::Relaxed);
            }
        })
    };
    while queries.load(Ordering::Relaxed) == 0 {
        std::thread::yield_now();
    }
    io.set_plan(fault);
    let p1 = fill(&sim, &pool, 1, 1);
    let req = publish_request(&s, &sim, 0, 0, &[(1, p1)]);
    let (copied, durable) = publish_replies(&mut s, 0, req);
    assert_eq!(copied, vec![PageStatus::Ok]);
    let Message::PublishDurable { pages, .. } = durable else {
        panic!("{durable:?}")
    };
    assert_eq!(pages, vec![PageStatus::RetryLater]);
    // Queries went on while the write failed and after; none saw block 1.
    let before = queries.load(Ordering::Relaxed);
    while queries.load(Ordering::Relaxed) < before + 20 {
        std::thread::yield_now();
    }
    stop.store(true, Ordering::Release);
    querier
        .join()
        .unwrap_or_else(|_| panic!("the querier panicked"));
    assert_eq!(
        seen.load(Ordering::Relaxed),
        16,
        "a failed publish was visible"
    );
    // The fault gone and the store's retry delay passed, the page publishes and is visible.
    io.set_plan(FaultPlan::default());
    std::thread::sleep(orbitkv_store::NO_SPACE_RETRY + Duration::from_millis(50));
    let p1 = fill(&sim, &pool, 1, 1);
    assert_eq!(publish(&mut s, &sim, &[(1, p1)]), vec![PageStatus::Ok]);
    match s
        .scheduler
        .query(common::query(&s, vec![hash(0), hash(1)], 32))
    {
        Ok(Answer::Proof(p)) => assert_eq!(p.boundary, 32),
        other => panic!("{other:?}"),
    }
}

#[test]
fn lmcache_4991_a_publish_whose_write_fails_with_eio_is_never_visible() {
    a_failed_publish_is_never_visible(FaultPlan {
        fail_write: Some(1),
        ..Default::default()
    });
}

#[test]
fn lmcache_4991_a_publish_that_meets_a_full_disk_is_never_visible() {
    a_failed_publish_is_never_visible(FaultPlan {
        space_bytes: Some(0),
        ..Default::default()
    });
}

#[test]
fn lmcache_4991_a_publish_whose_fsync_fails_is_never_visible() {
    a_failed_publish_is_never_visible(FaultPlan {
        fail_sync: Some(1),
        ..Default::default()
    });
}
