//! Per-client limits protect the daemon: store pins per connection (an Acquire that would pass
//! the limit is refused and pins nothing) and page bytes per Load or Publish (refused whole,
//! nothing copied or stored); a client that keeps within them is served as usual.

mod common;

use common::{Daemon, seal};
use orbitkv_protocol::client::ClientError;
use orbitkv_protocol::message::{GroupHashes, QueryRequest};
use orbitkv_protocol::{ErrorCode, Message};
use orbitkv_sim::{EngineOptions, SimEngine, SimError, SimInstance};
use orbitkv_state::engine_hash::vllm::{RequestExtras, VllmHashAlgo, VllmHasher};

/// 64 tokens: four 16-token blocks.
fn tokens() -> Vec<u64> {
    (0..64).map(|i| (i * 7 + 3) % 32_000).collect()
}

fn engine(d: &Daemon, name: &str, pool_pages: u32) -> SimEngine {
    let mut o = EngineOptions::new(d.socket.clone(), SimInstance::new(name, 1));
    o.pool_pages = pool_pages;
    SimEngine::start(o).unwrap_or_else(|e| panic!("{e}"))
}

fn limit_exceeded(r: Result<impl std::fmt::Debug, SimError>) -> String {
    match r {
        Err(SimError::Client(ClientError::Refused {
            code: ErrorCode::LimitExceeded,
            detail,
            ..
        })) => detail,
        other => panic!("not refused for a limit: {other:?}"),
    }
}

#[test]
fn an_acquire_past_the_pin_limit_is_refused_and_pins_nothing() {
    let d = Daemon::start_with(|c| c.max_pins_per_client = 3);
    let mut publisher = engine(&d, "limits-pub", 64);
    publisher.run(&tokens()).unwrap_or_else(|e| panic!("{e}"));
    let mut s = seal(&d, &SimInstance::new("limits-q", 1));
    let hasher =
        VllmHasher::new(VllmHashAlgo::Sha256Cbor, 16, None).unwrap_or_else(|e| panic!("{e}"));
    let hashes = hasher
        .block_hashes(&tokens(), 0, None, &RequestExtras::default())
        .unwrap_or_else(|e| panic!("{e}"));
    let q = |n: usize| QueryRequest {
        token: s.token,
        epoch: s.epoch,
        origin: 0,
        end: 16 * n as u64,
        groups: vec![GroupHashes {
            group: 0,
            hashes: hashes[..n].to_vec(),
        }],
    };
    match s.scheduler.request(&Message::Acquire(q(4))) {
        Err(ClientError::Refused {
            code: ErrorCode::LimitExceeded,
            detail,
            ..
        }) => assert!(detail.contains("limit of 3"), "{detail}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(d.store.usage().pins, 0, "a refused acquire pins nothing");
    match s.scheduler.request(&Message::Acquire(q(3))) {
        Ok(Message::Leased { proof, .. }) => assert_eq!(proof.boundary, 48),
        other => panic!("{other:?}"),
    }
    assert_eq!(d.store.usage().pins, 3);
    // The limit counts what the connection holds: one more pin is refused until a release.
    assert!(matches!(
        s.scheduler.request(&Message::Acquire(q(1))),
        Err(ClientError::Refused {
            code: ErrorCode::LimitExceeded,
            ..
        })
    ));
}

#[test]
fn a_request_past_the_byte_limit_is_refused_whole_and_a_split_one_is_served() {
    // Two pages' bytes per request.
    let page = SimInstance::new("x", 1).page_bytes();
    let d = Daemon::start_with(|c| c.max_request_bytes = 2 * page);
    let mut big = engine(&d, "limits-big", 64);
    let detail = limit_exceeded(big.run(&tokens()));
    assert!(detail.contains("Publish"), "{detail}");
    assert_eq!(d.store.usage().records, 0, "nothing stored");
    drop(big);
    // Batches of two pages keep within the limit: published, then loaded by another engine.
    let mut small = engine(&d, "limits-small", 2);
    small.run(&tokens()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(d.store.usage().records, 4);
    let mut reader = engine(&d, "limits-reader", 2);
    let o = reader.run(&tokens()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        (o.boundary, o.pages.loaded, o.pages.wrong_bytes),
        (64, 4, 0)
    );
    // A reader loading four pages at once is refused (the lease it took is released when its
    // connection closes).
    let mut greedy = engine(&d, "limits-greedy", 64);
    let detail = limit_exceeded(greedy.run(&tokens()));
    assert!(detail.contains("Load"), "{detail}");
}
