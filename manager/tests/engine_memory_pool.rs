//! A pool in memory the engine allocated itself (SGLang's `allocator: shm`), through the
//! daemon: the engine's descriptor holds the pages at an offset with no header, the state words
//! in a states-only region beside it. Memory sealed against shrinking is mapped; memory that is
//! not is copied with pread/pwrite, and the engine shrinking it under the daemon fails the pages
//! it no longer holds — the daemon neither crashes nor grows the memory back. A descriptor that
//! is not memory (tmpfs) is refused.

mod common;

use std::fs::File;
use std::os::fd::AsFd;
use std::os::unix::fs::FileExt;

use common::pages::{acquire, block_bytes, hash, publish_replies, publish_request};
use common::{Daemon, seal};
use orbitkv_gpu_bridge::{HostPool, PageRef, PoolSpec};
use orbitkv_protocol::client::ClientError;
use orbitkv_protocol::message::{LoadPage, LoadRequest};
use orbitkv_protocol::{ErrorCode, Message, PageStatus};
use orbitkv_sim::SimInstance;

const PAGES: u32 = 8;

/// Registers a pool of `sim`'s on worker 0 with its pages in `memory` from `offset`.
fn register(
    s: &mut common::Sealed,
    spec: &PoolSpec,
    states: &HostPool,
    memory: &File,
    offset: u64,
) -> Result<(), ClientError> {
    let (client, token) = &mut s.workers[0];
    client.register_engine_memory_pool(*token, spec.clone(), offset, states.fd(), memory.as_fd())
}

/// Engine memory sealed against shrinking: a host pool's own region (a memfd), and the offset
/// of its pages in it.
fn sealed_memory(spec: &PoolSpec) -> (File, u64) {
    let host = HostPool::create(spec.clone()).unwrap_or_else(|e| panic!("{e}"));
    let memory = File::from(
        host.fd()
            .try_clone_to_owned()
            .unwrap_or_else(|e| panic!("{e}")),
    );
    (memory, host.data_offset())
}

/// Reuses page `index` (its state word) and writes block `block` into the engine's memory.
fn fill(
    sim: &SimInstance,
    states: &HostPool,
    memory: &File,
    offset: u64,
    index: u32,
    block: u32,
) -> PageRef {
    let page = states.reuse(index).unwrap_or_else(|e| panic!("{e}"));
    memory
        .write_all_at(
            &block_bytes(sim, block),
            offset + u64::from(index) * sim.page_bytes(),
        )
        .unwrap_or_else(|e| panic!("{e}"));
    page
}

fn load(s: &mut common::Sealed, lease: u64, pages: &[(u32, PageRef)]) -> Vec<PageStatus> {
    let req = LoadRequest {
        token: s.workers[0].1,
        epoch: s.epoch,
        lease,
        pages: pages
            .iter()
            .map(|(block, page)| LoadPage {
                block: *block,
                group: 0,
                rank: 0,
                page: *page,
                layer_start: 0,
                layer_end: 2,
            })
            .collect(),
    };
    match s.workers[0].0.request(&Message::Load(req)) {
        Ok(Message::Loaded { pages }) => pages,
        other => panic!("{other:?}"),
    }
}

#[test]
fn an_unsealed_engine_memory_serves_pages_and_a_shrink_fails_them_without_harm() {
    let d = Daemon::start();
    let sim = SimInstance::new("shm-a", 1);
    let mut s = seal(&d, &sim);
    let spec = sim.pool_spec(1, PAGES);
    let states = HostPool::create_states(spec.clone()).unwrap_or_else(|e| panic!("{e}"));
    // The engine's memory: the tensor at offset 0, the memfd rounded up past it, no seals.
    let len = u64::from(PAGES) * sim.page_bytes();
    let memory = orbitkv_gpu_bridge::host::engine_memory(len.next_multiple_of(1 << 20))
        .unwrap_or_else(|e| panic!("{e}"));
    // A file that is not memory is refused: copies through it could wait on its file system.
    let not_memory = File::open("/proc/self/status").unwrap_or_else(|e| panic!("{e}"));
    match register(&mut s, &spec, &states, &not_memory, 0) {
        Err(ClientError::Refused { code, detail, .. }) => {
            assert_eq!(code, ErrorCode::Malformed);
            assert!(detail.contains("not memory"), "{detail}");
        }
        other => panic!("{other:?}"),
    }
    // Too small for the pool from this offset: refused at registration.
    let r = register(&mut s, &spec, &states, &memory, (1 << 20) - 100);
    match r {
        Err(ClientError::Refused { code, detail, .. }) => {
            assert_eq!(code, ErrorCode::Malformed);
            assert!(detail.contains("engine memory holds"), "{detail}");
        }
        other => panic!("{other:?}"),
    }
    register(&mut s, &spec, &states, &memory, 0).unwrap_or_else(|e| panic!("{e}"));
    // Publish blocks 0 and 1, load them into pages 4 and 5, byte-exact.
    let pages: Vec<(u32, PageRef)> = (0..2)
        .map(|b| (b, fill(&sim, &states, &memory, 0, b, b)))
        .collect();
    let req = publish_request(&s, &sim, 0, 0, &pages);
    let (copied, _) = publish_replies(&mut s, 0, req);
    assert_eq!(copied, vec![PageStatus::Ok; 2]);
    let (lease, boundary) = acquire(&mut s, 2, 32);
    assert_eq!(boundary, 32);
    let dst: Vec<(u32, PageRef)> = (0..2)
        .map(|b| (b, states.reuse(4 + b).unwrap_or_else(|e| panic!("{e}"))))
        .collect();
    assert_eq!(load(&mut s, lease, &dst), vec![PageStatus::Ok; 2]);
    for b in 0..2u32 {
        let mut got = vec![0u8; sim.page_bytes() as usize];
        memory
            .read_exact_at(&mut got, u64::from(4 + b) * sim.page_bytes())
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(got, block_bytes(&sim, b), "block {b}");
    }
    // The engine shrinks its memory to 3 pages under the daemon.
    let kept = 3 * sim.page_bytes();
    memory.set_len(kept).unwrap_or_else(|e| panic!("{e}"));
    // A Publish of page 6 (gone) fails that page alone; page 2 (kept) is stored.
    let p2 = states.reuse(2).unwrap_or_else(|e| panic!("{e}"));
    memory
        .write_all_at(&block_bytes(&sim, 2), 2 * sim.page_bytes())
        .unwrap_or_else(|e| panic!("{e}"));
    let p6 = states.reuse(6).unwrap_or_else(|e| panic!("{e}"));
    let mut req = publish_request(&s, &sim, 0, 0, &[(2, p2), (3, p6)]);
    req.pages[1].hash = hash(3);
    let (copied, _) = publish_replies(&mut s, 0, req);
    assert_eq!(copied[0], PageStatus::Ok);
    assert_eq!(copied[1], PageStatus::BadGeometry);
    // A Load into page 7 (gone) fails and does not grow the memory back.
    let p7 = states.reuse(7).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        load(&mut s, lease, &[(0, p7)]),
        vec![PageStatus::BadGeometry]
    );
    let size = memory.metadata().unwrap_or_else(|e| panic!("{e}")).len();
    assert_eq!(size, kept, "the daemon grew the engine's memory back");
    // The daemon serves on.
    let stats = s.scheduler.stats().unwrap_or_else(|e| panic!("{e}"));
    assert!(stats.contains("orbitkv_published_pages_total 3"), "{stats}");
}

#[test]
fn engine_memory_sealed_against_shrinking_is_mapped_at_its_offset() {
    let d = Daemon::start();
    let sim = SimInstance::new("shm-b", 1);
    let mut s = seal(&d, &sim);
    let spec = sim.pool_spec(1, PAGES);
    let states = HostPool::create_states(spec.clone()).unwrap_or_else(|e| panic!("{e}"));
    let (memory, offset) = sealed_memory(&spec);
    register(&mut s, &spec, &states, &memory, offset).unwrap_or_else(|e| panic!("{e}"));
    let p = fill(&sim, &states, &memory, offset, 1, 9);
    let req = publish_request(&s, &sim, 0, 0, &[(0, p)]);
    let (copied, _) = publish_replies(&mut s, 0, req);
    assert_eq!(copied, vec![PageStatus::Ok]);
    let (lease, _) = acquire(&mut s, 1, 16);
    let dst = states.reuse(3).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(load(&mut s, lease, &[(0, dst)]), vec![PageStatus::Ok]);
    let mut got = vec![0u8; sim.page_bytes() as usize];
    memory
        .read_exact_at(&mut got, offset + 3 * sim.page_bytes())
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(got, block_bytes(&sim, 9));
}

#[test]
fn descriptors_of_unsealed_engine_memory_are_bounded_over_the_daemon() {
    // The count is this process's (nextest runs each test in a process of its own).
    let d = Daemon::start_with(|c| c.max_kept_files = 2);
    let sim = SimInstance::new("shm-c", 1);
    let mut s = seal(&d, &sim);
    let len = (u64::from(PAGES) * sim.page_bytes()).next_multiple_of(1 << 20);
    let unsealed = |s: &mut common::Sealed, id: u32| {
        let spec = sim.pool_spec(id, PAGES);
        let states = HostPool::create_states(spec.clone()).unwrap_or_else(|e| panic!("{e}"));
        let memory = orbitkv_gpu_bridge::host::engine_memory(len).unwrap_or_else(|e| panic!("{e}"));
        register(s, &spec, &states, &memory, 0)
    };
    unsealed(&mut s, 1).unwrap_or_else(|e| panic!("{e}"));
    unsealed(&mut s, 2).unwrap_or_else(|e| panic!("{e}"));
    match unsealed(&mut s, 3) {
        Err(ClientError::Refused { code, detail, .. }) => {
            assert_eq!(code, ErrorCode::LimitExceeded);
            assert!(detail.contains("F_SEAL_SHRINK"), "{detail}");
        }
        other => panic!("{other:?}"),
    }
    // Memory sealed against shrinking is mapped, its descriptor closed: not counted.
    let spec = sim.pool_spec(4, PAGES);
    let states = HostPool::create_states(spec.clone()).unwrap_or_else(|e| panic!("{e}"));
    let (memory, offset) = sealed_memory(&spec);
    register(&mut s, &spec, &states, &memory, offset).unwrap_or_else(|e| panic!("{e}"));
    // One given back: another is taken.
    let token = s.workers[0].1;
    s.workers[0]
        .0
        .unregister_pool(token, orbitkv_gpu_bridge::PoolId(1))
        .unwrap_or_else(|e| panic!("{e}"));
    unsealed(&mut s, 5).unwrap_or_else(|e| panic!("{e}"));
}
