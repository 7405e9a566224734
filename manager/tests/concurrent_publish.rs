//! Publishers racing on one key, through the daemon. Regression for Mooncake #1374 (two clients
//! putting one key at once left it "existing but empty"): two engines of one computation
//! publishing the same blocks at the same time leave, for each block, exactly one intact record
//! — byte-equal to one publisher's page, never empty, zero or mixed. And the ranks of one
//! instance publishing the same block hash never overwrite each other: each rank's shard comes
//! back to that rank.

mod common;

use std::sync::{Arc, Barrier};

use common::pages::{
    fill_with, hash, load_request, page_bytes, publish_replies, publish_request, register_pool_on,
    salted_bytes,
};
use common::{Daemon, Sealed, seal};
use orbitkv_protocol::{Message, PageStatus};
use orbitkv_sim::SimInstance;

const BLOCKS: u32 = 8;
const ROUNDS: u32 = 6;

/// Publishes blocks `first..first + BLOCKS` from worker 0 of `s` with `salt`ed bytes, once the
/// barrier lets every publisher go; returns the final statuses.
fn publish_salted(
    mut s: Sealed,
    sim: SimInstance,
    first: u32,
    salt: u8,
    barrier: Arc<Barrier>,
) -> (Sealed, Vec<PageStatus>) {
    let pool = register_pool_on(&mut s, &sim, 0, 100 + first);
    let pages: Vec<_> = (0..BLOCKS)
        .map(|i| {
            let b = first + i;
            (b, fill_with(&pool, i, &salted_bytes(&sim, b, salt)))
        })
        .collect();
    let req = publish_request(&s, &sim, 0, 0, &pages);
    barrier.wait();
    let (_, durable) = publish_replies(&mut s, 0, req);
    let Message::PublishDurable { pages, .. } = durable else {
        panic!("{durable:?}")
    };
    (s, pages)
}

#[test]
fn mooncake_1374_two_engines_publishing_one_key_at_once_leave_one_intact_record() {
    let d = Daemon::start();
    // Two instances of one computation: one namespace, the same keys.
    let (sim_a, sim_b) = (
        SimInstance::new("engine-a", 1),
        SimInstance::new("engine-b", 1),
    );
    let (mut a, mut b) = (Some(seal(&d, &sim_a)), Some(seal(&d, &sim_b)));
    assert_eq!(
        a.as_ref().map(|s| s.namespace),
        b.as_ref().map(|s| s.namespace)
    );
    for round in 0..ROUNDS {
        let first = round * BLOCKS;
        let barrier = Arc::new(Barrier::new(2));
        let run = |s: Option<Sealed>, sim: &SimInstance, salt: u8| {
            let (s, sim, barrier) = (
                s.unwrap_or_else(|| panic!("an engine is gone")),
                sim.clone(),
                barrier.clone(),
            );
            std::thread::spawn(move || publish_salted(s, sim, first, salt, barrier))
        };
        let (ta, tb) = (run(a.take(), &sim_a, 0x00), run(b.take(), &sim_b, 0xFF));
        let (sa, st_a) = ta.join().unwrap_or_else(|_| panic!("engine a panicked"));
        let (sb, st_b) = tb.join().unwrap_or_else(|_| panic!("engine b panicked"));
        // Both copies are stored (the later one replaces the earlier): no page is refused.
        assert_eq!(st_a, vec![PageStatus::Ok; BLOCKS as usize], "round {round}");
        assert_eq!(st_b, vec![PageStatus::Ok; BLOCKS as usize], "round {round}");
        (a, b) = (Some(sa), Some(sb));
    }
    let mut s = a.unwrap_or_else(|| panic!("engine a is gone"));
    // Every block: exactly one record, and its bytes are one publisher's page exactly.
    let total = ROUNDS * BLOCKS;
    assert_eq!(d.store.usage().records, total as usize);
    let q = common::query(&s, (0..total).map(hash).collect(), u64::from(total) * 16);
    let (lease, boundary) = match s.scheduler.request(&Message::Acquire(q)) {
        Ok(Message::Leased { lease, proof, .. }) => (lease, proof.boundary),
        other => panic!("{other:?}"),
    };
    assert_eq!(boundary, u64::from(total) * 16);
    let pool = register_pool_on(&mut s, &sim_a, 0, 7);
    for blk in 0..total {
        let dst = fill_with(&pool, 0, &vec![0x5A; sim_a.page_bytes() as usize]);
        let req = load_request(&s, 0, 0, lease, &[(blk, dst, 0, 2)]);
        match s.workers[0].0.request(&Message::Load(req)) {
            Ok(Message::Loaded { pages }) => assert_eq!(pages, vec![PageStatus::Ok]),
            other => panic!("{other:?}"),
        }
        let got = page_bytes(&sim_a, &pool, 0);
        assert!(
            got == salted_bytes(&sim_a, blk, 0x00) || got == salted_bytes(&sim_a, blk, 0xFF),
            "block {blk}: a record that is neither publisher's page"
        );
    }
}

#[test]
fn ranks_publishing_one_block_hash_never_overwrite_each_other() {
    let d = Daemon::start();
    let sim = SimInstance::new("tp2", 2);
    let mut s = seal(&d, &sim);
    let pools: Vec<_> = (0..2)
        .map(|w| register_pool_on(&mut s, &sim, w, 1 + w as u32))
        .collect();
    // Both ranks publish blocks 0..4 (the same hashes) at once, each its own shard's bytes.
    let reqs: Vec<_> = (0..2usize)
        .map(|w| {
            let pages: Vec<_> = (0..4u32)
                .map(|b| {
                    (
                        b,
                        fill_with(&pools[w], b, &salted_bytes(&sim, b, w as u8 + 1)),
                    )
                })
                .collect();
            publish_request(&s, &sim, w, w as u32, &pages)
        })
        .collect();
    let mut ids = Vec::new();
    for (w, req) in reqs.into_iter().enumerate() {
        let c = &mut s.workers[w].0;
        ids.push(
            c.send(&Message::Publish(req))
                .unwrap_or_else(|e| panic!("{e}")),
        );
    }
    for (w, id) in ids.into_iter().enumerate() {
        let c = &mut s.workers[w].0;
        assert!(matches!(c.reply(id), Ok(Message::PublishCopied { .. })));
        assert_eq!(
            c.reply(id).unwrap_or_else(|e| panic!("{e}")),
            Message::PublishDurable {
                pages: vec![PageStatus::Ok; 4],
                retry_after_ms: 0,
            }
        );
    }
    // A worker naming another rank's shard is rejected, and stores nothing.
    let stray = fill_with(&pools[0], 9, &salted_bytes(&sim, 9, 0x77));
    let req = publish_request(&s, &sim, 0, 1, &[(9, stray)]);
    let (_, durable) = publish_replies(&mut s, 0, req);
    assert_eq!(
        durable,
        Message::PublishDurable {
            pages: vec![PageStatus::Rejected],
            retry_after_ms: 0,
        }
    );
    // Each rank loads its own shard back, byte-exact.
    let q = common::query(&s, (0..4).map(hash).collect(), 64);
    let lease = match s.scheduler.request(&Message::Acquire(q)) {
        Ok(Message::Leased { lease, proof, .. }) => {
            assert_eq!(proof.boundary, 64);
            lease
        }
        other => panic!("{other:?}"),
    };
    for (w, pool) in pools.iter().enumerate() {
        let dsts: Vec<_> = (0..4u32)
            .map(|b| {
                (
                    b,
                    fill_with(pool, 8 + b, &vec![0; sim.page_bytes() as usize]),
                )
            })
            .collect();
        let pages: Vec<_> = dsts.iter().map(|(b, p)| (*b, *p, 0, 2)).collect();
        let req = load_request(&s, w, w as u32, lease, &pages);
        match s.workers[w].0.request(&Message::Load(req)) {
            Ok(Message::Loaded { pages }) => assert_eq!(pages, vec![PageStatus::Ok; 4]),
            other => panic!("{other:?}"),
        }
        for b in 0..4u32 {
            assert_eq!(
                page_bytes(&sim, pool, 8 + b),
                salted_bytes(&sim, b, w as u8 + 1),
                "rank {w} block {b}"
            );
        }
    }
}
