//! The data path over the socket with a host pool in shared memory: a worker registers its pool
//! (the descriptor passed with SCM_RIGHTS), publishes pages into the store, the scheduler acquires
//! them, and a worker loads them into other pages — every byte checked against what was
//! published. Fencing: a Load naming a page's old generation is refused and the page untouched;
//! a Publish from a stale page stores nothing; pages are named per page in the reply.

mod common;

use common::pages::{acquire, block_bytes, fill, load, publish, register_pool};
use common::{Daemon, seal};
use orbitkv_gpu_bridge::PageRef;
use orbitkv_protocol::PageStatus;
use orbitkv_sim::SimInstance;

#[test]
fn published_pages_come_back_byte_exact_into_other_pages() {
    let d = Daemon::start();
    let sim = SimInstance::new("engine-p", 1);
    let mut s = seal(&d, &sim);
    let pool = register_pool(&mut s, &sim);
    let pages: Vec<(u32, PageRef)> = (0..4).map(|b| (b, fill(&sim, &pool, b, b))).collect();
    assert_eq!(publish(&mut s, &sim, &pages), vec![PageStatus::Ok; 4]);
    let (lease, boundary) = acquire(&mut s, 4, 64);
    assert_eq!(boundary, 64);
    // Load block b into page 8 + b: whole pages, and block 3 layer by layer.
    let dst: Vec<PageRef> = (0..4)
        .map(|b| pool.reuse(8 + b).unwrap_or_else(|e| panic!("{e}")))
        .collect();
    let st = load(
        &mut s,
        lease,
        &[
            (0, dst[0], 0, 2),
            (1, dst[1], 0, 2),
            (2, dst[2], 0, 2),
            (3, dst[3], 0, 1),
            (3, dst[3], 1, 2),
        ],
    );
    assert_eq!(st, vec![PageStatus::Ok; 5]);
    let mut wrong_bytes = 0usize;
    for b in 0..4u32 {
        let mut got = vec![0u8; sim.page_bytes() as usize];
        pool.read(8 + b, 0, &mut got)
            .unwrap_or_else(|e| panic!("{e}"));
        wrong_bytes += got
            .iter()
            .zip(block_bytes(&sim, b))
            .filter(|(a, e)| **a != *e)
            .count();
    }
    assert_eq!(wrong_bytes, 0);
    let stats = s.scheduler.stats().unwrap_or_else(|e| panic!("{e}"));
    assert!(stats.contains("orbitkv_published_pages_total 4"), "{stats}");
    assert!(stats.contains("orbitkv_loaded_pages_total 5"), "{stats}");
}

#[test]
fn stale_pages_are_refused_per_page_and_never_written_or_stored() {
    let d = Daemon::start();
    let sim = SimInstance::new("engine-f", 1);
    let mut s = seal(&d, &sim);
    let pool = register_pool(&mut s, &sim);
    // Publish: page 1's reference is stale (the engine reused it after naming it).
    let p0 = fill(&sim, &pool, 0, 0);
    let p1_old = fill(&sim, &pool, 1, 1);
    let _p1_new = fill(&sim, &pool, 1, 1);
    let st = publish(&mut s, &sim, &[(0, p0), (1, p1_old)]);
    assert_eq!(st, vec![PageStatus::Ok, PageStatus::StaleGeneration]);
    // Only block 0 was stored: the proof stops at 16 tokens.
    let (lease, boundary) = acquire(&mut s, 2, 32);
    assert_eq!(boundary, 16);
    // A Load queued against page 9's old generation: refused, page untouched; an index out of
    // range and an unknown pool are named too.
    let old = pool.reuse(9).unwrap_or_else(|e| panic!("{e}"));
    let _now = fill(&sim, &pool, 9, 77);
    let bad_index = PageRef { index: 99, ..old };
    let bad_pool = PageRef {
        pool: orbitkv_gpu_bridge::PoolId(5),
        ..old
    };
    let st = load(
        &mut s,
        lease,
        &[
            (0, old, 0, 2),
            (0, bad_index, 0, 2),
            (0, bad_pool, 0, 2),
            (1, old, 0, 2),
        ],
    );
    assert_eq!(
        st,
        vec![
            PageStatus::StaleGeneration,
            PageStatus::OutOfRange,
            PageStatus::UnknownPool,
            PageStatus::Missing,
        ]
    );
    let mut got = vec![0u8; sim.page_bytes() as usize];
    pool.read(9, 0, &mut got).unwrap_or_else(|e| panic!("{e}"));
    assert!(
        got == block_bytes(&sim, 77),
        "a refused load wrote into the page"
    );
    assert_eq!(pool.leases(9).unwrap_or_else(|e| panic!("{e}")), 0);
    // A layer range past the group's layers is refused for its page only (a reversed one does
    // not decode: the whole request is malformed).
    let now = pool.page_ref(9).unwrap_or_else(|e| panic!("{e}"));
    let st = load(&mut s, lease, &[(0, now, 1, 3), (0, now, 0, 2)]);
    assert_eq!(st, vec![PageStatus::BadGeometry, PageStatus::Ok]);
}
