//! Identity vs placement, through the daemon with the simulated engine: instances of one
//! computation that place their pages differently in their pools (page-outermost,
//! layer-outermost as vLLM's LBNHC, K and V buffers apart as SGLang's layer_first) share
//! records byte-exact, also loading a layer sub-range; an instance whose KV byte order differs
//! (head-major) shares nothing; SGLang's page_first (layers inside tokens: its own byte order)
//! shares with itself only and refuses a layer sub-range; a pool whose groups alias the same
//! bytes serves a hybrid instance whose pages move from one group to the other; overlapping or
//! ill-placed pools are refused at registration.

mod common;

use common::pages::{acquire, load_request, publish_replies, publish_request};
use common::{Daemon, seal};
use orbitkv_gpu_bridge::{HostPool, PageMemory};
use orbitkv_protocol::client::ClientError;
use orbitkv_protocol::{ErrorCode, Message, PageStatus};
use orbitkv_sim::workload::synthetic;
use orbitkv_sim::{EngineOptions, Report, SimContract, SimEngine, SimInstance, SimPlacement};

const PLACEMENTS: [SimPlacement; 3] = [
    SimPlacement::Page,
    SimPlacement::Layer,
    SimPlacement::KvBuffers,
];

/// Runs `requests` through a new engine of `inst`; an instance named `*-consumer` publishes
/// nothing.
fn run(d: &Daemon, inst: SimInstance, requests: &[Vec<u64>]) -> Report {
    let mut opts = EngineOptions::new(d.socket.clone(), inst);
    opts.pool_pages = 64;
    opts.publish = !opts.instance.name.ends_with("-consumer");
    let mut e = SimEngine::start(opts).unwrap_or_else(|e| panic!("start: {e}"));
    for r in requests {
        e.run(r).unwrap_or_else(|e| panic!("request: {e}"));
    }
    e.report().clone()
}

fn placed(name: &str, placement: SimPlacement) -> SimInstance {
    let mut inst = SimInstance::new(name, 1);
    inst.layers = 3;
    inst.kv_heads = 2;
    inst.placement = placement;
    inst
}

#[test]
fn every_placement_loads_what_every_other_published_and_byte_order_is_identity() {
    let d = Daemon::start();
    let reqs = synthetic(5, 12, 16);
    let with_blocks = reqs.iter().filter(|r| r.len() >= 16).count() as u64;
    for (i, p) in PLACEMENTS.iter().enumerate() {
        // Each placement publishes its own computation (one identity byte apart); every
        // placement then loads it.
        let mut producer = placed(&format!("pub-{i}"), *p);
        producer.identity[0] = i as u8;
        let first = run(&d, producer.clone(), &reqs);
        assert_eq!((first.errors, first.pages.wrong_bytes), (0, 0), "{p:?}");
        assert!(first.pages.published > 0);
        for (j, q) in PLACEMENTS.iter().enumerate() {
            let mut consumer = producer.clone();
            consumer.name = format!("load-{i}-{j}-consumer");
            consumer.placement = *q;
            let r = run(&d, consumer, &reqs);
            assert_eq!(
                (r.errors, r.pages.wrong_bytes, r.unproven, r.pages.failed),
                (0, 0, 0, 0),
                "{p:?} -> {q:?}: {r:?}"
            );
            assert_eq!(r.hits, with_blocks, "{p:?} -> {q:?}: {r:?}");
            assert!(r.pages.loaded > 0);
        }
        // The same computation with another KV byte order: another state format, so another
        // namespace — nothing is shared.
        let mut other = producer.clone();
        other.name = format!("hnd-{i}-consumer");
        other.head_major = true;
        let r = run(&d, other, &reqs);
        assert_eq!((r.hits, r.pages.loaded), (0, 0), "{p:?} head-major: {r:?}");
    }
}

/// A worker's host pool of `sim`'s placement, registered on worker 0.
fn register(s: &mut common::Sealed, sim: &SimInstance, id: u32) -> HostPool {
    let spec = sim.pool_spec(id, 8);
    let pool = HostPool::create(spec.clone()).unwrap_or_else(|e| panic!("{e}"));
    let (client, token) = &mut s.workers[0];
    client
        .register_pool(*token, spec, PageMemory::Host, pool.fd())
        .unwrap_or_else(|e| panic!("{e}"));
    pool
}

#[test]
fn a_layer_sub_range_loads_into_its_runs_alone() {
    let d = Daemon::start();
    let sim = placed("sub-p", SimPlacement::Page);
    let mut s = seal(&d, &sim);
    let src = register(&mut s, &sim, 1);
    let page_bytes = sim.page_bytes() as usize;
    let record: Vec<u8> = (0..page_bytes).map(|i| (i * 13 % 251) as u8).collect();
    let page = src.reuse(0).unwrap_or_else(|e| panic!("{e}"));
    src.write_group(0, 0, &record)
        .unwrap_or_else(|e| panic!("{e}"));
    let req = publish_request(&s, &sim, 0, 0, &[(0, page)]);
    let (copied, _) = publish_replies(&mut s, 0, req);
    assert_eq!(copied, vec![PageStatus::Ok]);
    // A layer-outermost consumer of the same computation loads layer 1 alone.
    let mut lsim = sim.clone();
    lsim.name = "sub-l".into();
    lsim.placement = SimPlacement::Layer;
    let mut l = seal(&d, &lsim);
    let dst = register(&mut l, &lsim, 1);
    let (lease, boundary) = acquire(&mut l, 1, 16);
    assert_eq!(boundary, 16);
    let marker = vec![0xEE; page_bytes];
    let page = dst.reuse(3).unwrap_or_else(|e| panic!("{e}"));
    dst.write_group(3, 0, &marker)
        .unwrap_or_else(|e| panic!("{e}"));
    let req = load_request(&l, 0, 0, lease, &[(0, page, 1, 2)]);
    match l.workers[0].0.request(&Message::Load(req)) {
        Ok(Message::Loaded { pages }) => assert_eq!(pages, vec![PageStatus::Ok]),
        other => panic!("{other:?}"),
    }
    let mut got = vec![0u8; page_bytes];
    dst.read_group(3, 0, &mut got)
        .unwrap_or_else(|e| panic!("{e}"));
    let layer = page_bytes / 3;
    assert_eq!(got[..layer], marker[..layer], "layer 0 untouched");
    assert_eq!(
        got[layer..2 * layer],
        record[layer..2 * layer],
        "layer 1 loaded"
    );
    assert_eq!(got[2 * layer..], marker[2 * layer..], "layer 2 untouched");
    // And nothing else in the pool moved: every other page still holds zeros.
    let mut other = vec![0u8; page_bytes];
    for i in (0..8).filter(|i| *i != 3) {
        dst.read_group(i, 0, &mut other)
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(other.iter().all(|b| *b == 0), "page {i}");
    }
}

#[test]
fn an_aliased_pool_serves_pages_that_move_between_groups() {
    let d = Daemon::start();
    // Sliding-window KV and recurrent state with pages of one size (16-token blocks, heads of
    // 32), both groups backed by the same pool bytes.
    let mut inst = SimInstance::new("alias-a", 1);
    inst.contract = SimContract::Hybrid;
    inst.head_size = 32;
    inst.aliased = true;
    let spec = inst.pool_spec(1, 8);
    assert!(spec.aliased);
    assert_eq!(spec.groups[0].offset, spec.groups[1].offset);
    let reqs = synthetic(3, 40, 16);
    let first = run(&d, inst.clone(), &reqs);
    assert_eq!(
        (first.errors, first.pages.wrong_bytes, first.unproven),
        (0, 0, 0),
        "{first:?}"
    );
    assert!(first.pages.published > 0);
    // The consumer's engine puts items of both groups through the same pages in turn: a page
    // holds a window block in one batch and a checkpoint in the next.
    // Aliased or not, placed anyhow: the same records.
    for p in PLACEMENTS {
        let mut consumer = inst.clone();
        consumer.name = format!("alias-{p:?}-consumer");
        consumer.placement = p;
        consumer.aliased = p == SimPlacement::Page;
        let second = run(&d, consumer, &reqs);
        assert_eq!(
            (second.errors, second.pages.wrong_bytes, second.unproven),
            (0, 0, 0),
            "{p:?}: {second:?}"
        );
        assert!(
            second.hits > 0 && second.pages.loaded > 0,
            "{p:?}: {second:?}"
        );
    }
}

#[test]
fn a_block_reused_as_another_groups_page_is_fenced_by_one_state_word() {
    let d = Daemon::start();
    let mut inst = SimInstance::new("alias-f", 1);
    inst.contract = SimContract::Hybrid;
    inst.head_size = 32;
    inst.aliased = true;
    let mut s = seal(&d, &inst);
    let pool = register(&mut s, &inst, 1);
    let len = inst.page_bytes() as usize;
    // Page 2 holds group 0's state at generation g; the engine reuses it for group 1.
    let old = pool.reuse(2).unwrap_or_else(|e| panic!("{e}"));
    pool.write_group(2, 0, &vec![1; len])
        .unwrap_or_else(|e| panic!("{e}"));
    let new = pool.reuse(2).unwrap_or_else(|e| panic!("{e}"));
    pool.write_group(2, 1, &vec![2; len])
        .unwrap_or_else(|e| panic!("{e}"));
    // A Publish naming the page as group 0 at its old generation stores nothing.
    let mut req = publish_request(&s, &inst, 0, 0, &[(0, old)]);
    req.pages[0].group = 0;
    let (copied, _) = publish_replies(&mut s, 0, req);
    assert_eq!(copied, vec![PageStatus::StaleGeneration]);
    // Named at its new generation, the same bytes are group 1's.
    assert_eq!(new.generation, old.generation + 1);
    let mut got = vec![0u8; len];
    pool.read_group(2, 0, &mut got)
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(got, vec![2; len], "one set of bytes for both groups");
}

#[test]
fn pools_whose_groups_overlap_or_leave_their_memory_are_refused() {
    let d = Daemon::start();
    let mut inst = SimInstance::new("bad-pool", 1);
    inst.contract = SimContract::Hybrid;
    inst.head_size = 32;
    let mut s = seal(&d, &inst);
    let good = inst.pool_spec(1, 8);
    let mut overlapping = good.clone();
    overlapping.groups[1].offset = overlapping.groups[0].offset;
    let mut past_end = good.clone();
    past_end.groups[1].page_stride += 1;
    let mut aliased_apart = good.clone();
    aliased_apart.aliased = true;
    for (what, spec) in [
        ("overlap", overlapping),
        ("ends past", past_end),
        ("placed differently", aliased_apart),
    ] {
        // The region is made for the good spec: the refusal comes from the geometry alone.
        let pool = HostPool::create(good.clone()).unwrap_or_else(|e| panic!("{e}"));
        let (client, token) = &mut s.workers[0];
        let r = client.register_pool(*token, spec, PageMemory::Host, pool.fd());
        match r {
            Err(ClientError::Refused { code, detail, .. }) => {
                assert_eq!(code, ErrorCode::Malformed, "{what}: {detail}");
                assert!(detail.contains(what), "{what}: {detail}");
            }
            other => panic!("{what}: {other:?}"),
        }
    }
}

#[test]
fn page_first_shares_with_itself_only_and_refuses_a_layer_sub_range() {
    let d = Daemon::start();
    let reqs = synthetic(8, 12, 16);
    let with_blocks = reqs.iter().filter(|r| r.len() >= 16).count() as u64;
    let producer = placed("pf-a", SimPlacement::PageFirst);
    let spec = producer.pool_spec(1, 4);
    assert!(spec.groups[0].layers_inside);
    let first = run(&d, producer.clone(), &reqs);
    assert_eq!((first.errors, first.pages.wrong_bytes), (0, 0), "{first:?}");
    let mut consumer = producer.clone();
    consumer.name = "pf-b-consumer".into();
    let r = run(&d, consumer, &reqs);
    assert_eq!(
        (r.errors, r.pages.wrong_bytes, r.unproven),
        (0, 0, 0),
        "{r:?}"
    );
    assert_eq!(r.hits, with_blocks, "{r:?}");
    // Layer-major engines of the same computation order bytes otherwise: nothing shared.
    let mut other = producer.clone();
    other.name = "pf-layer-first-consumer".into();
    other.placement = SimPlacement::KvBuffers;
    let r = run(&d, other, &reqs);
    assert_eq!((r.hits, r.pages.loaded), (0, 0), "{r:?}");
    // A Load of layer 1 alone into a page_first page is refused; the whole page loads.
    let mut s = seal(&d, &producer);
    let pool = register(&mut s, &producer, 1);
    let page_bytes = producer.page_bytes() as usize;
    let p = pool.reuse(0).unwrap_or_else(|e| panic!("{e}"));
    pool.write_group(0, 0, &vec![5; page_bytes])
        .unwrap_or_else(|e| panic!("{e}"));
    let req = publish_request(&s, &producer, 0, 0, &[(0, p)]);
    let (copied, _) = publish_replies(&mut s, 0, req);
    assert_eq!(copied, vec![PageStatus::Ok]);
    let (lease, _) = acquire(&mut s, 1, 16);
    let dst = pool.reuse(2).unwrap_or_else(|e| panic!("{e}"));
    let req = load_request(&s, 0, 0, lease, &[(0, dst, 1, 2), (0, dst, 0, 3)]);
    match s.workers[0].0.request(&Message::Load(req)) {
        Ok(Message::Loaded { pages }) => {
            assert_eq!(pages, vec![PageStatus::BadGeometry, PageStatus::Ok]);
        }
        other => panic!("{other:?}"),
    }
    let mut got = vec![0u8; page_bytes];
    pool.read_group(2, 0, &mut got)
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(got, vec![5; page_bytes]);
}
