//! Refusals tell the engine whether to retry, through the daemon: a full disk gives a retryable
//! refusal with a delay — per page of a Publish, and for a whole request (a seal whose namespace
//! cannot be registered) — while a read-only store refuses for good, and still serves what it
//! holds.

mod common;

use common::pages::{
    acquire, block_bytes, fill, fill_with, load, page_bytes, publish, publish_replies,
    publish_request, register_pool,
};
use common::{Daemon, fault_store, seal};
use orbitkv_protocol::client::{Client, ClientError};
use orbitkv_protocol::{ErrorCode, Message, PageStatus, Role};
use orbitkv_sim::SimInstance;
use orbitkv_store::io::fault::{FaultIo, FaultPlan};

#[test]
fn a_full_disk_is_a_retryable_refusal_with_a_delay() {
    let io = FaultIo::new();
    let d = Daemon::on(fault_store(&io, false));
    let sim = SimInstance::new("full", 1);
    let mut s = seal(&d, &sim);
    let pool = register_pool(&mut s, &sim);
    io.set_plan(FaultPlan {
        space_bytes: Some(0),
        ..Default::default()
    });
    let pages: Vec<_> = (0..2).map(|b| (b, fill(&sim, &pool, b, b))).collect();
    let req = publish_request(&s, &sim, 0, 0, &pages);
    let (_, durable) = publish_replies(&mut s, 0, req);
    match durable {
        Message::PublishDurable {
            pages,
            retry_after_ms,
        } => {
            assert_eq!(pages, vec![PageStatus::RetryLater; 2]);
            assert!(
                retry_after_ms > 0 && retry_after_ms <= 1000,
                "{retry_after_ms}"
            );
        }
        other => panic!("{other:?}"),
    }
    // A new computation's seal needs its namespace registered: refused, to be retried.
    let mut other = sim.clone();
    other.name = "full-2".into();
    other.dtype = "float16".into();
    let mut threads = Vec::new();
    for (role, rank) in [(Role::Scheduler, 0), (Role::Worker, 0)] {
        let (socket, reg) = (
            d.socket.clone(),
            other
                .registration(role, rank)
                .unwrap_or_else(|e| panic!("{e}")),
        );
        threads.push(std::thread::spawn(move || {
            let mut c = Client::connect(&socket).unwrap_or_else(|e| panic!("{e}"));
            c.request(&Message::Register(reg))
        }));
    }
    for t in threads {
        match t.join().unwrap_or_else(|_| panic!("rank thread panicked")) {
            Err(ClientError::Refused {
                code: ErrorCode::RetryLater,
                retry_after,
                ..
            }) => assert!(!retry_after.is_zero()),
            other => panic!("not a retryable refusal: {other:?}"),
        }
    }
}

#[test]
fn a_read_only_store_refuses_for_good_and_serves_what_it_holds() {
    let io = FaultIo::new();
    let sim = SimInstance::new("ro", 1);
    {
        let d = Daemon::on(fault_store(&io, false));
        let mut s = seal(&d, &sim);
        let pool = register_pool(&mut s, &sim);
        let p0 = fill(&sim, &pool, 0, 0);
        assert_eq!(publish(&mut s, &sim, &[(0, p0)]), vec![PageStatus::Ok]);
    }
    let d = Daemon::on(fault_store(&io, true));
    // The namespace is registered already: the instance seals and its records are served.
    let mut s = seal(&d, &sim);
    let pool = register_pool(&mut s, &sim);
    let (lease, boundary) = acquire(&mut s, 1, 16);
    assert_eq!(boundary, 16);
    let dst = fill_with(&pool, 4, &vec![0; sim.page_bytes() as usize]);
    assert_eq!(load(&mut s, lease, &[(0, dst, 0, 2)]), vec![PageStatus::Ok]);
    assert_eq!(page_bytes(&sim, &pool, 4), block_bytes(&sim, 0));
    // Writes are refused for good.
    let p1 = fill(&sim, &pool, 1, 1);
    let req = publish_request(&s, &sim, 0, 0, &[(1, p1)]);
    let (_, durable) = publish_replies(&mut s, 0, req);
    assert_eq!(
        durable,
        Message::PublishDurable {
            pages: vec![PageStatus::Refused],
            retry_after_ms: 0,
        }
    );
    let namespace = s.namespace.0;
    match s.scheduler.request(&Message::Retire { namespace }) {
        Err(ClientError::Refused {
            code: ErrorCode::Refused,
            retry_after,
            detail,
        }) => {
            assert!(retry_after.is_zero());
            assert!(detail.contains("read-only"), "{detail}");
        }
        other => panic!("not refused for good: {other:?}"),
    }
}
