//! A source page reused during a Publish copy, through the daemon: an engine that reallocates
//! its page without waiting (bumping the generation, then writing new bytes, while the daemon
//! copies) never gets a torn record stored — every record the daemon reports stored holds
//! exactly the bytes of the generation its Publish named, and the others are reported
//! `ChangedDuringCopy` or `StaleGeneration`.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::{Daemon, seal};
use orbitkv_gpu_bridge::{HostPool, PageMemory, PageRef, PoolId};
use orbitkv_protocol::PageStatus;
use orbitkv_protocol::message::{PublishPage, PublishRequest};
use orbitkv_sim::SimInstance;
use orbitkv_state::{CacheGroupId, Component, HashDomain, RankSpec, StateKey};

fn hash(generation: u64) -> Vec<u8> {
    let mut h = vec![0u8; 32];
    h[..8].copy_from_slice(&generation.to_le_bytes());
    h[31] = 0x3C;
    h
}

#[test]
fn no_page_reused_mid_copy_is_stored() {
    let d = Daemon::start();
    // 32 layers × 16 tokens × 8 heads × 128 elements × K and V × 2 bytes: 2 MiB pages, so the
    // daemon's copies take long enough to overlap the engine's reuses.
    let mut sim = SimInstance::new("churn", 1);
    sim.layers = 32;
    sim.kv_heads = 8;
    sim.head_size = 128;
    let page_bytes = sim.page_bytes() as usize;
    let mut s = seal(&d, &sim);
    let pool = Arc::new(HostPool::create(sim.pool_spec(1, 1)).unwrap_or_else(|e| panic!("{e}")));
    let (worker, token) = &mut s.workers[0];
    let token = *token;
    worker
        .register_pool(token, sim.pool_spec(1, 1), PageMemory::Host, pool.fd())
        .unwrap_or_else(|e| panic!("{e}"));
    let fill = move |g: u64| vec![(g % 251) as u8 + 1; page_bytes];
    let ready = Arc::new(AtomicU64::new(
        pool.page_ref(0)
            .unwrap_or_else(|e| panic!("{e}"))
            .generation,
    ));
    pool.write(0, 0, &fill(ready.load(Ordering::Acquire)))
        .unwrap_or_else(|e| panic!("{e}"));
    let stop = Arc::new(AtomicBool::new(false));
    let churn = {
        let (pool, ready, stop) = (pool.clone(), ready.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut k = 0u64;
            while !stop.load(Ordering::Acquire) {
                // Reallocate without asking, write the new bytes back to front (crossing the
                // daemon's front-to-back copy), then leave the page alone a varying while.
                let r = pool
                    .reuse_ignoring_leases(0)
                    .unwrap_or_else(|e| panic!("{e}"));
                let bytes = fill(r.generation);
                for (i, chunk) in bytes.chunks(64 << 10).enumerate().rev() {
                    pool.write(0, (i as u64) << 16, chunk)
                        .unwrap_or_else(|e| panic!("{e}"));
                }
                ready.store(r.generation, Ordering::Release);
                k += 1;
                std::thread::sleep(Duration::from_micros((k % 7) * 300));
            }
        })
    };
    let (mut stored, mut discarded, mut mid_copy) = (Vec::new(), 0, 0);
    let deadline = Instant::now() + Duration::from_secs(30);
    while (stored.len() < 10 || mid_copy < 3) && Instant::now() < deadline {
        let generation = ready.load(Ordering::Acquire);
        let page = PageRef {
            pool: PoolId(1),
            index: 0,
            generation,
        };
        let req = PublishRequest {
            token,
            epoch: s.epoch,
            pages: vec![PublishPage {
                group: 0,
                rank: 0,
                hash: hash(generation),
                parent: vec![],
                start: 0,
                end: 16,
                page,
            }],
        };
        let fin = worker
            .publish(req, |_| {})
            .unwrap_or_else(|e| panic!("{e}"));
        match fin.pages[0] {
            PageStatus::Ok => stored.push(generation),
            PageStatus::ChangedDuringCopy => {
                mid_copy += 1;
                discarded += 1;
            }
            PageStatus::StaleGeneration => discarded += 1,
            other => panic!("unexpected status {other:?}"),
        }
    }
    stop.store(true, Ordering::Release);
    churn
        .join()
        .unwrap_or_else(|_| panic!("the engine thread panicked"));
    assert!(!stored.is_empty(), "no copy ever finished between reuses");
    assert!(
        discarded > 0,
        "the engine never reused the page during a copy"
    );
    // Every stored record holds its generation's bytes, exactly.
    let mut out = Vec::new();
    for g in &stored {
        let key = StateKey::new(
            s.namespace,
            HashDomain::VllmSha256Cbor,
            &hash(*g),
            CacheGroupId(0),
            Component::DenseKv,
            RankSpec::Rank(0),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        d.store
            .get(&key, &mut out)
            .unwrap_or_else(|e| panic!("{e}"))
            .unwrap_or_else(|| panic!("generation {g} reported stored but absent"));
        assert!(out == fill(*g), "generation {g}'s record holds other bytes");
    }
    eprintln!(
        "stored {}, discarded {discarded} ({mid_copy} reused during the copy)",
        stored.len()
    );
}
