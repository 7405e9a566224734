//! Query and Acquire over the socket: the proof names exactly the records to load; a two-rank
//! instance gets a hit only where both ranks' records exist; Query has no side effects; Acquire
//! pins the proven records under a lease that ends on Release, on its TTL, or when the client
//! goes; forged tokens and old epochs are refused.

mod common;

use std::time::{Duration, Instant};

use common::{Daemon, seal};
use orbitkv_protocol::client::{Answer, ClientError};
use orbitkv_protocol::message::QueryRequest;
use orbitkv_protocol::{ErrorCode, Message};
use orbitkv_segments::RecordMeta;
use orbitkv_sim::SimInstance;
use orbitkv_state::{
    CacheGroupId, Component, HashDomain, Namespace, RankSpec, StateKey, TokenRange,
};

fn hash(block: u32) -> Vec<u8> {
    let mut h = vec![0u8; 32];
    h[..4].copy_from_slice(&block.to_le_bytes());
    h[31] = 0xAB;
    h
}

fn key(ns: Namespace, block: u32, rank: u32) -> StateKey {
    StateKey::new(
        ns,
        HashDomain::VllmSha256Cbor,
        &hash(block),
        CacheGroupId(0),
        Component::DenseKv,
        RankSpec::Rank(rank),
    )
    .unwrap_or_else(|e| panic!("{e}"))
}

/// Stores block `block` of rank `rank` as the engine would have published it.
fn publish(d: &Daemon, sim: &SimInstance, ns: Namespace, block: u32, rank: u32) {
    let bt = u64::from(sim.block_tokens);
    let format = sim
        .format(rank)
        .and_then(|f| f.digest())
        .unwrap_or_else(|e| panic!("{e}"));
    let meta = RecordMeta {
        key: key(ns, block, rank),
        parent: (block > 0).then(|| key(ns, block - 1, rank)),
        range: TokenRange::new(u64::from(block) * bt, u64::from(block + 1) * bt)
            .unwrap_or_else(|e| panic!("{e}")),
        format,
    };
    let payload = vec![block as u8; sim.page_bytes() as usize];
    d.store
        .put(&[(meta, payload.as_slice())])
        .unwrap_or_else(|e| panic!("{e}"));
}

fn query(s: &common::Sealed, blocks: u32, end: u64) -> QueryRequest {
    common::query(s, (0..blocks).map(hash).collect(), end)
}

#[test]
fn a_hit_needs_every_ranks_records_and_query_has_no_side_effects() {
    let d = Daemon::start();
    let sim = SimInstance::new("engine-q", 2);
    let mut s = seal(&d, &sim);
    // Nothing stored: a miss, with a reason.
    match s.scheduler.request(&Message::Query(query(&s, 4, 64))) {
        Ok(Message::Miss { reason, detail }) => assert!(reason > 0, "{detail}"),
        other => panic!("{other:?}"),
    }
    // Rank 0 has blocks 0..4, rank 1 only 0..2: the proof stops at 32 tokens.
    for b in 0..4 {
        publish(&d, &sim, s.namespace, b, 0);
    }
    for b in 0..2 {
        publish(&d, &sim, s.namespace, b, 1);
    }
    let pins_before = d.store.usage().pins;
    for _ in 0..3 {
        match s.scheduler.request(&Message::Query(query(&s, 4, 64))) {
            Ok(Message::Proof(p)) => {
                assert_eq!(p.boundary, 32);
                assert_eq!(p.loads.len(), 2, "{p:?}");
                for l in &p.loads {
                    assert_eq!(l.blocks, vec![0, 1], "{p:?}");
                }
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(d.store.usage().pins, pins_before, "a query pins nothing");
    // Both ranks complete: the whole request.
    for b in 2..4 {
        publish(&d, &sim, s.namespace, b, 1);
    }
    match s.scheduler.request(&Message::Query(query(&s, 4, 64))) {
        Ok(Message::Proof(p)) => assert_eq!(p.boundary, 64),
        other => panic!("{other:?}"),
    }
    let stats = s.scheduler.stats().unwrap_or_else(|e| panic!("{e}"));
    assert!(stats.contains("orbitkv_hits_total 4"), "{stats}");
    assert!(stats.contains("orbitkv_queries_total 5"), "{stats}");
}

#[test]
fn acquire_pins_until_release_ttl_or_disconnect() {
    let d = Daemon::start_with(|c| c.lease_ttl = Duration::from_millis(200));
    let sim = SimInstance::new("engine-l", 2);
    let mut s = seal(&d, &sim);
    for b in 0..3 {
        publish(&d, &sim, s.namespace, b, 0);
        publish(&d, &sim, s.namespace, b, 1);
    }
    // Acquire then Release.
    let lease = match s.scheduler.request(&Message::Acquire(query(&s, 3, 48))) {
        Ok(Message::Leased { lease, proof, .. }) => {
            assert_eq!(proof.boundary, 48);
            lease
        }
        other => panic!("{other:?}"),
    };
    assert_eq!(d.store.usage().pins, 6, "both ranks' three records pinned");
    assert!(matches!(
        s.scheduler.request(&Message::Release {
            token: s.token,
            lease
        }),
        Ok(Message::Released)
    ));
    assert_eq!(d.store.usage().pins, 0);
    assert!(matches!(
        s.scheduler.request(&Message::Release {
            token: s.token,
            lease
        }),
        Err(ClientError::Refused {
            code: ErrorCode::UnknownLease,
            ..
        })
    ));
    // An unused lease ends with its TTL.
    assert!(matches!(
        s.scheduler.request(&Message::Acquire(query(&s, 3, 48))),
        Ok(Message::Leased { .. })
    ));
    assert_eq!(d.store.usage().pins, 6);
    let deadline = Instant::now() + Duration::from_secs(5);
    while d.store.usage().pins != 0 {
        assert!(Instant::now() < deadline, "the lease did not expire");
        std::thread::sleep(Duration::from_millis(20));
    }
    // A client that goes away takes its leases with it.
    let d2 = Daemon::start();
    let mut s2 = seal(&d2, &sim);
    for b in 0..3 {
        publish(&d2, &sim, s2.namespace, b, 0);
        publish(&d2, &sim, s2.namespace, b, 1);
    }
    assert!(matches!(
        s2.scheduler.request(&Message::Acquire(query(&s2, 3, 48))),
        Ok(Message::Leased { .. })
    ));
    assert_eq!(d2.store.usage().pins, 6);
    drop(s2);
    let deadline = Instant::now() + Duration::from_secs(5);
    while d2.store.usage().pins != 0 {
        assert!(
            Instant::now() < deadline,
            "the disconnected client's pins were kept"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn forged_tokens_and_old_epochs_are_refused() {
    let d = Daemon::start();
    let sim = SimInstance::new("engine-t", 1);
    let mut s = seal(&d, &sim);
    let mut forged = query(&s, 1, 16);
    forged.token[0] ^= 1;
    assert!(matches!(
        s.scheduler.request(&Message::Query(forged)),
        Err(ClientError::Refused {
            code: ErrorCode::BadToken,
            ..
        })
    ));
    // The engine restarts: a new seal; the old token's epoch is stale.
    let s2 = seal(&d, &sim);
    assert!(s2.epoch > s.epoch);
    let old = query(&s, 1, 16);
    assert!(matches!(
        s.scheduler.request(&Message::Query(old)),
        Err(ClientError::Refused {
            code: ErrorCode::StaleEpoch,
            ..
        })
    ));
    let stats = s.scheduler.stats().unwrap_or_else(|e| panic!("{e}"));
    assert!(stats.contains("orbitkv_refused_tokens_total 2"), "{stats}");
}

#[test]
fn a_record_of_another_format_is_never_proven_and_is_counted() {
    let d = Daemon::start();
    let sim = SimInstance::new("engine-r", 1);
    let mut s = seal(&d, &sim);
    // Block 0 stored under the instance's key, but with another format's digest (bytes of
    // another layout; the store keeps one format per namespace, group and rank).
    let meta = RecordMeta {
        key: key(s.namespace, 0, 0),
        parent: None,
        range: TokenRange::new(0, 16).unwrap_or_else(|e| panic!("{e}")),
        format: orbitkv_state::FormatDigest([0xEE; 32]),
    };
    let payload = vec![0u8; sim.page_bytes() as usize];
    d.store
        .put(&[(meta, payload.as_slice())])
        .unwrap_or_else(|e| panic!("{e}"));
    match s.scheduler.query(query(&s, 1, 16)) {
        Ok(Answer::Miss { .. }) => {}
        other => panic!("a record of another format was served: {other:?}"),
    }
    let stats = s.scheduler.stats().unwrap_or_else(|e| panic!("{e}"));
    assert!(
        stats.contains("orbitkv_validator_rejections_total{reason=\"format\"} 1"),
        "{stats}"
    );
}
