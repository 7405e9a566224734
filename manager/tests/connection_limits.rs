//! Limits on what peers may hold, through the socket: connections past the configured number
//! are refused with a typed error (and one is accepted again once another closes); the memory
//! one connection holds — Publish copies waiting to be stored among it — is capped, a Publish
//! past it refused with a typed, retryable error and nothing copied; registrations waiting for
//! their round count in that memory too; limits that do not fit together refuse to start.

mod common;

use std::time::Duration;

use common::pages::{fill, publish, publish_request, register_pool};
use common::slow_io::SlowSync;
use common::{Daemon, seal};
use orbitkv_manager::server::{ServeError, Server, ServerConfig};
use orbitkv_protocol::client::{Client, ClientError};
use orbitkv_protocol::{ErrorCode, Message, PageStatus, Role};
use orbitkv_sim::SimInstance;

#[test]
fn connections_past_the_limit_are_refused_with_a_typed_error() {
    let d = Daemon::start_with(|c| c.max_connections = 3);
    let mut held: Vec<Client> = (0..3).map(|_| d.client()).collect();
    let mut extra = Client::connect(&d.socket).unwrap_or_else(|e| panic!("{e}"));
    match extra.hello("extra") {
        Err(ClientError::Refused {
            code: ErrorCode::LimitExceeded,
            detail,
            ..
        }) => assert!(detail.contains("at most 3 connections"), "{detail}"),
        other => panic!("not refused: {other:?}"),
    }
    // One closes: a new connection is served.
    held.pop();
    let mut again = None;
    for _ in 0..100 {
        let mut c = Client::connect(&d.socket).unwrap_or_else(|e| panic!("{e}"));
        if c.hello("again").is_ok() {
            again = Some(c);
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut c = again.unwrap_or_else(|| panic!("no connection accepted after one closed"));
    let stats = c.stats().unwrap_or_else(|e| panic!("{e}"));
    assert!(
        stats.contains("orbitkv_refused_connections_total "),
        "{stats}"
    );
}

#[test]
fn publishes_waiting_to_be_stored_are_held_to_the_connections_memory() {
    let io = SlowSync::default();
    let store = io.store();
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let mut sim = SimInstance::new("mem", 1);
    sim.kv_heads = 8;
    sim.head_size = 64;
    let page = sim.page_bytes();
    // Room for two pages' copies beside one body: the third Publish in flight is refused.
    let d = Daemon::serve(store, dir, |c| {
        c.max_body = 64 << 10;
        c.max_request_bytes = page;
        c.max_connection_bytes = (64 << 10) + 2 * page;
    });
    let mut s = seal(&d, &sim);
    let pool = register_pool(&mut s, &sim);
    let p0 = fill(&sim, &pool, 0, 0);
    assert_eq!(publish(&mut s, &sim, &[(0, p0)]), vec![PageStatus::Ok]);
    // Stores now take 400 ms per sync: Publishes pile up behind the first.
    io.set_delay(Duration::from_millis(400));
    let mut ids = Vec::new();
    for b in 1..5u32 {
        let p = fill(&sim, &pool, b, b);
        let req = publish_request(&s, &sim, 0, 0, &[(b, p)]);
        ids.push(
            s.workers[0]
                .0
                .send(&Message::Publish(req))
                .unwrap_or_else(|e| panic!("{e}")),
        );
    }
    let (mut durable, mut refused) = (0, 0);
    for id in ids {
        match s.workers[0].0.reply(id) {
            Ok(Message::PublishCopied { .. }) => match s.workers[0].0.reply(id) {
                Ok(Message::PublishDurable { pages, .. }) => {
                    assert_eq!(pages, vec![PageStatus::Ok]);
                    durable += 1;
                }
                other => panic!("{other:?}"),
            },
            Err(ClientError::Refused {
                code: ErrorCode::RetryLater,
                detail,
                ..
            }) => {
                assert!(detail.contains("memory limit"), "{detail}");
                refused += 1;
            }
            other => panic!("{other:?}"),
        }
    }
    assert!(
        durable >= 1 && refused >= 1,
        "{durable} durable, {refused} refused"
    );
    io.set_delay(Duration::ZERO);
}

#[test]
fn limits_that_do_not_fit_together_refuse_to_start() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let mut c = ServerConfig::new(dir.path().join("s.sock"));
    c.max_connection_bytes = c.max_request_bytes;
    match Server::bind(c, common::store(&dir.path().join("data"))) {
        Err(ServeError::Config(why)) => assert!(why.contains("at least"), "{why}"),
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("started with a connection memory below one request"),
    }
}

#[test]
fn registrations_waiting_for_their_round_are_held_to_the_connections_memory() {
    // A round of 8 ranks that never completes: each Register waits, its 40 kB layout held.
    let d = Daemon::start_with(|c| {
        c.max_body = 64 << 10;
        c.max_request_bytes = 64 << 10;
        // Two waiting registrations and a third's frame fit; its held bytes do not.
        c.max_connection_bytes = 140_000;
    });
    let sim = SimInstance::new("held", 8);
    let reg = |rank: u32| {
        let mut r = sim
            .registration(Role::Worker, rank)
            .unwrap_or_else(|e| panic!("{e}"));
        r.layout = vec![7; 40_000];
        r.seal_timeout_ms = 60_000;
        r
    };
    let mut c = d.client();
    let refused = |c: &mut Client, rank: u32| {
        let id = c
            .send(&Message::Register(reg(rank)))
            .unwrap_or_else(|e| panic!("{e}"));
        match c.reply(id) {
            Err(ClientError::Refused { code, detail, .. }) => (code, detail),
            other => panic!("answered {other:?}"),
        }
    };
    c.stream()
        .set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap_or_else(|e| panic!("{e}"));
    // Two wait (no reply within the read timeout); the third would pass the limit.
    for rank in 0..2 {
        let id = c
            .send(&Message::Register(reg(rank)))
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(c.reply(id).is_err(), "rank {rank} waits for its round");
    }
    c.stream()
        .set_read_timeout(None)
        .unwrap_or_else(|e| panic!("{e}"));
    let (code, detail) = refused(&mut c, 2);
    assert_eq!(code, ErrorCode::LimitExceeded, "{detail}");
    assert!(detail.contains("registration"), "{detail}");
    // Another connection holds its own: its registration waits as well.
    let mut other = d.client();
    let id = other
        .send(&Message::Register(reg(3)))
        .unwrap_or_else(|e| panic!("{e}"));
    other
        .stream()
        .set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(other.reply(id).is_err(), "rank 3 waits for its round");
}

#[test]
fn a_publish_of_tiny_pages_is_held_as_the_frames_it_builds() {
    // Pages of a few bytes each take a frame header apiece: counted as such, many of them
    // pass the connection's memory though their bytes are few.
    let d = Daemon::start_with(|c| {
        c.max_body = 64 << 10;
        c.max_request_bytes = 64 << 10;
        c.max_connection_bytes = (128 << 10) + 16_000;
    });
    let mut sim = SimInstance::new("tiny", 1);
    sim.layers = 1;
    sim.kv_heads = 1;
    sim.head_size = 1;
    sim.block_tokens = 1;
    assert!(sim.page_bytes() <= 16, "{} bytes", sim.page_bytes());
    let mut s = seal(&d, &sim);
    let pool = register_pool(&mut s, &sim);
    let pages: Vec<_> = (0..16).map(|b| fill(&sim, &pool, b, b)).collect();
    let many = |n: u32| -> Vec<(u32, orbitkv_gpu_bridge::PageRef)> {
        (0..n).map(|b| (b, pages[(b % 16) as usize])).collect()
    };
    // A few are stored.
    assert!(
        publish(&mut s, &sim, &many(20))
            .iter()
            .all(|p| *p == PageStatus::Ok)
    );
    // 500 pages of a few bytes: some kB of page bytes, over 128 kB of frames.
    let req = publish_request(&s, &sim, 0, 0, &many(500));
    match s.workers[0].0.request(&Message::Publish(req)) {
        Err(ClientError::Refused {
            code: ErrorCode::LimitExceeded,
            detail,
            ..
        }) => assert!(detail.contains("500 frames"), "{detail}"),
        other => panic!("not refused: {other:?}"),
    }
}

#[test]
fn a_reply_past_the_frame_limit_is_refused_not_sent() {
    // The metrics text is some kB: past a 2 KiB frame limit, which the client holds the daemon
    // to. Sent, it would end the connection; refused, the connection serves on.
    let d = Daemon::start_with(|c| {
        c.max_body = 2048;
        c.max_request_bytes = 2048;
        c.max_connection_bytes = 8192;
    });
    let mut c = d.client();
    match c.stats() {
        Err(ClientError::Refused {
            code: ErrorCode::LimitExceeded,
            detail,
            ..
        }) => assert!(detail.contains("frame limit"), "{detail}"),
        other => panic!("{other:?}"),
    }
    c.sync()
        .unwrap_or_else(|e| panic!("the connection serves on: {e}"));
}

#[test]
fn publishes_waiting_to_be_stored_are_held_to_the_daemons_memory_over_every_connection() {
    let io = SlowSync::default();
    let store = io.store();
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let sim = |name: &str| {
        let mut sim = SimInstance::new(name, 1);
        sim.kv_heads = 8;
        sim.head_size = 64;
        sim
    };
    let (a, b) = (sim("ga"), sim("gb"));
    let page = a.page_bytes();
    // Room for two pages' frames over the daemon; each connection has room for many.
    let d = Daemon::serve(store, dir, |c| {
        c.max_request_bytes = page;
        c.max_publish_bytes = 2 * page + 2048;
    });
    let (mut sa, mut sb) = (seal(&d, &a), seal(&d, &b));
    let (pa, pb) = (register_pool(&mut sa, &a), register_pool(&mut sb, &b));
    let p0 = fill(&a, &pa, 0, 0);
    assert_eq!(publish(&mut sa, &a, &[(0, p0)]), vec![PageStatus::Ok]);
    // Stores now take 2 s per sync: one Publish from each connection fills the limit.
    io.set_delay(Duration::from_secs(2));
    let send = |s: &mut common::Sealed,
                sim: &SimInstance,
                pool: &orbitkv_gpu_bridge::HostPool,
                block: u32| {
        let p = fill(sim, pool, block, block);
        let req = publish_request(s, sim, 0, 0, &[(block, p)]);
        s.workers[0]
            .0
            .send(&Message::Publish(req))
            .unwrap_or_else(|e| panic!("{e}"))
    };
    // Each copied (its PublishCopied back) before the next is sent: their order is known.
    let copied = |s: &mut common::Sealed, id: u64| {
        assert!(matches!(
            s.workers[0].0.reply(id),
            Ok(Message::PublishCopied { .. })
        ));
    };
    let first_a = send(&mut sa, &a, &pa, 1);
    copied(&mut sa, first_a);
    let first_b = send(&mut sb, &b, &pb, 1);
    copied(&mut sb, first_b);
    let second_a = send(&mut sa, &a, &pa, 2);
    match sa.workers[0].0.reply(second_a) {
        Err(ClientError::Refused {
            code: ErrorCode::RetryLater,
            detail,
            ..
        }) => assert!(detail.contains("over every connection"), "{detail}"),
        other => panic!("not refused: {other:?}"),
    }
    for (s, id) in [(&mut sa, first_a), (&mut sb, first_b)] {
        assert!(matches!(
            s.workers[0].0.reply(id),
            Ok(Message::PublishDurable { .. })
        ));
    }
    io.set_delay(Duration::ZERO);
    // Stored, its memory is back: a Publish is taken again.
    let p = fill(&a, &pa, 3, 3);
    assert_eq!(publish(&mut sa, &a, &[(3, p)]), vec![PageStatus::Ok]);
}
