//! A lease belongs to one epoch of one instance and to live records, through the daemon: after
//! the instance re-registers (as another computation, or as the same one), a Load or Release
//! naming a lease of the old epoch is refused `StaleEpoch` and no byte moves; the old epoch's
//! pins are given back at the seal. After a retirement, a Load under a lease taken before it
//! moves no byte, from the DRAM tier or from SSD, and the lease's pins are given back.

mod common;

use std::sync::Arc;

use common::pages::{
    acquire, fill, fill_with, load_request, page_bytes, publish, register_pool_on, reseal,
};
use common::{Daemon, seal};
use orbitkv_protocol::client::ClientError;
use orbitkv_protocol::{ErrorCode, Message};
use orbitkv_sim::SimInstance;
use orbitkv_store::{StateStore, StoreConfig};

const SENTINEL: u8 = 0xA5;

fn refusal(r: Result<Message, ClientError>) -> ErrorCode {
    match r {
        Err(ClientError::Refused { code, .. }) => code,
        other => panic!("not refused: {other:?}"),
    }
}

/// Re-registers instance `s` as `b` on the same connections after it published and acquired
/// as `a`; the old lease must move nothing into the new epoch's pages.
fn old_lease_after_reseal(a: &SimInstance, b: &SimInstance) {
    let d = Daemon::start();
    let mut s = seal(&d, a);
    let pool = register_pool_on(&mut s, a, 0, 1);
    let pages: Vec<_> = (0..2).map(|blk| (blk, fill(a, &pool, blk, blk))).collect();
    publish(&mut s, a, &pages);
    let (lease, boundary) = acquire(&mut s, 2, 32);
    assert_eq!(boundary, 32);
    assert_eq!(d.store.usage().pins, 2);
    let old_namespace = s.namespace;
    reseal(&mut s, b);
    assert_eq!(s.namespace != old_namespace, a.dtype != b.dtype);
    // The old epoch's pins were given back at the seal.
    assert_eq!(d.store.usage().pins, 0);
    // The worker's pool under the new epoch, its page holding the sentinel.
    let pool = register_pool_on(&mut s, b, 0, 2);
    let dst = fill_with(&pool, 5, &vec![SENTINEL; b.page_bytes() as usize]);
    let req = load_request(&s, 0, 0, lease, &[(0, dst, 0, 2), (1, dst, 0, 2)]);
    let code = refusal(s.workers[0].0.request(&Message::Load(req)));
    assert_eq!(code, ErrorCode::StaleEpoch);
    assert!(
        page_bytes(b, &pool, 5).iter().all(|x| *x == SENTINEL),
        "a byte moved under an old epoch's lease"
    );
    assert_eq!(pool.leases(5).unwrap_or_else(|e| panic!("{e}")), 0);
    let token = s.token;
    let code = refusal(s.scheduler.request(&Message::Release { token, lease }));
    assert_eq!(code, ErrorCode::StaleEpoch);
    let stats = s.scheduler.stats().unwrap_or_else(|e| panic!("{e}"));
    assert!(stats.contains("orbitkv_leases 0\n"), "{stats}");
}

#[test]
fn a_lease_of_computation_a_moves_nothing_into_computation_b_after_a_reseal() {
    let a = SimInstance::new("s", 1);
    let mut b = a.clone();
    b.dtype = "float16".into();
    old_lease_after_reseal(&a, &b);
}

#[test]
fn a_lease_of_an_earlier_epoch_of_the_same_computation_is_refused_too() {
    let a = SimInstance::new("s", 1);
    old_lease_after_reseal(&a, &a.clone());
}

/// A daemon on a store with (or without) a DRAM tier.
fn daemon(dram_bytes: u64) -> Daemon {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let mut c = StoreConfig::new(dir.path().join("data"));
    c.durability = orbitkv_store::Durability::Manual;
    c.dram_bytes = dram_bytes;
    let io: Arc<dyn orbitkv_store::io::Io> = Arc::new(orbitkv_store::io::std_io::StdIo);
    let store = Arc::new(StateStore::open(io, c).unwrap_or_else(|e| panic!("{e}")));
    Daemon::serve(store, dir, |_| {})
}

fn retired_records_reach_no_page(dram_bytes: u64) {
    let d = daemon(dram_bytes);
    let sim = SimInstance::new("r", 1);
    let mut s = seal(&d, &sim);
    let pool = register_pool_on(&mut s, &sim, 0, 1);
    let pages: Vec<_> = (0..3)
        .map(|blk| (blk, fill(&sim, &pool, blk, blk)))
        .collect();
    publish(&mut s, &sim, &pages);
    let (lease, _) = acquire(&mut s, 3, 48);
    // The lease serves before the retirement (from the DRAM tier when there is one).
    let dst = fill_with(&pool, 8, &vec![SENTINEL; sim.page_bytes() as usize]);
    let req = load_request(&s, 0, 0, lease, &[(0, dst, 0, 2)]);
    assert!(matches!(
        s.workers[0].0.request(&Message::Load(req)),
        Ok(Message::Loaded { .. })
    ));
    assert_eq!(d.store.stats().dram_hits > 0, dram_bytes > 0);
    let namespace = s.namespace.0;
    match s.scheduler.request(&Message::Retire { namespace }) {
        Ok(Message::Retired { .. }) => {}
        other => panic!("{other:?}"),
    }
    assert_eq!(
        d.store.usage().pins,
        0,
        "the retired lease's pins were given back"
    );
    // A Load under the earlier lease: nothing moves.
    let dst = fill_with(&pool, 9, &vec![SENTINEL; sim.page_bytes() as usize]);
    let blocks: Vec<_> = (0..3).map(|blk| (blk, dst, 0, 2)).collect();
    let req = load_request(&s, 0, 0, lease, &blocks);
    let code = refusal(s.workers[0].0.request(&Message::Load(req)));
    assert_eq!(code, ErrorCode::UnknownLease);
    assert!(
        page_bytes(&sim, &pool, 9).iter().all(|x| *x == SENTINEL),
        "a retired record reached a page"
    );
    // A fresh Query misses; releasing the ended lease is harmless.
    match s.scheduler.request(&Message::Query(common::query(
        &s,
        (0..3).map(common::pages::hash).collect(),
        48,
    ))) {
        Ok(Message::Miss { .. }) => {}
        other => panic!("a retired namespace still hits: {other:?}"),
    }
    let token = s.token;
    assert!(matches!(
        s.scheduler.request(&Message::Release { token, lease }),
        Ok(Message::Released)
    ));
    // Retiring a namespace the store does not hold names why.
    let code = refusal(s.scheduler.request(&Message::Retire {
        namespace: [0xEE; 32],
    }));
    assert_eq!(code, ErrorCode::UnknownNamespace);
}

#[test]
fn after_a_retirement_no_lease_serves_its_records_from_ssd() {
    retired_records_reach_no_page(0);
}

#[test]
fn after_a_retirement_no_lease_serves_its_records_from_the_dram_tier() {
    retired_records_reach_no_page(64 << 20);
}
