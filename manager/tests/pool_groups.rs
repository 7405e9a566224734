//! Pools as engines hand them over, through the daemon: a pool may hold some of the instance's
//! cache groups (SGLang keeps one host pool per component), each checked against the worker's
//! own format; a page of a group its pool does not hold is refused alone; ranks of a pipeline
//! whose stages hold different layer counts (3 + 2) register pages of different sizes and
//! share records byte-exact.

mod common;

use common::pages::hash;
use common::{Daemon, seal};
use orbitkv_gpu_bridge::{HostPool, PageMemory, PoolSpec};
use orbitkv_protocol::client::ClientError;
use orbitkv_protocol::message::{PublishPage, PublishRequest};
use orbitkv_protocol::{ErrorCode, Message, PageStatus};
use orbitkv_sim::workload::synthetic;
use orbitkv_sim::{EngineOptions, SimContract, SimEngine, SimInstance};

/// Registers `spec` on worker `worker`: the pool, or the refusal's code and detail.
fn register(
    s: &mut common::Sealed,
    worker: usize,
    spec: PoolSpec,
) -> Result<HostPool, (ErrorCode, String)> {
    let pool = HostPool::create(spec.clone()).unwrap_or_else(|e| panic!("{e}"));
    let (client, token) = &mut s.workers[worker];
    let r = client.register_pool(*token, spec, PageMemory::Host, pool.fd());
    match r {
        Ok(()) => Ok(pool),
        Err(ClientError::Refused { code, detail, .. }) => Err((code, detail)),
        other => panic!("{other:?}"),
    }
}

/// `spec` keeping only group `group`, renumbered as pool `id`, its pages `bytes` long.
fn only(spec: &PoolSpec, group: u32, id: u32) -> PoolSpec {
    let mut g = *spec.group(group).unwrap_or_else(|e| panic!("{e}"));
    let bytes = g.bytes_for(&g.all_layers());
    g.offset = 0;
    g.page_stride = bytes;
    PoolSpec {
        pool: orbitkv_gpu_bridge::PoolId(id),
        page_bytes: bytes,
        groups: vec![g],
        ..spec.clone()
    }
}

#[test]
fn a_pool_per_component_holds_only_its_group() {
    let d = Daemon::start();
    let mut inst = SimInstance::new("per-component", 1);
    inst.contract = SimContract::Hybrid;
    let mut s = seal(&d, &inst);
    let whole = inst.pool_spec(1, 4);
    let kv = register(&mut s, 0, only(&whole, 0, 10)).unwrap_or_else(|e| panic!("{e:?}"));
    let state = register(&mut s, 0, only(&whole, 1, 11)).unwrap_or_else(|e| panic!("{e:?}"));
    // A group the layout does not have, and a page size the format does not say, are refused.
    let mut stranger = only(&whole, 0, 12);
    stranger.groups[0].group = 7;
    let (code, detail) = register(&mut s, 0, stranger)
        .err()
        .unwrap_or_else(|| panic!());
    assert_eq!(code, ErrorCode::Malformed);
    assert!(detail.contains("does not have"), "{detail}");
    let mut short = only(&whole, 0, 13);
    short.groups[0].layers -= 1;
    let (code, detail) = register(&mut s, 0, short).err().unwrap_or_else(|| panic!());
    assert_eq!(code, ErrorCode::Malformed);
    assert!(detail.contains("format says"), "{detail}");
    // A page size that overflows is refused too; the handler does not panic on it.
    let mut huge = only(&whole, 0, 14);
    huge.groups[0].layers = u32::MAX;
    huge.groups[0].layer_bytes = 1 << 40;
    let (client, token) = &mut s.workers[0];
    match client.register_pool(*token, huge, PageMemory::Host, kv.fd()) {
        Err(ClientError::Refused { code, .. }) => assert_eq!(code, ErrorCode::Malformed),
        other => panic!("{other:?}"),
    }
    // Block 0 of each group from its own pool; group 1 named in the KV pool fails alone.
    let groups = inst.groups();
    let kv_page = kv.reuse(0).unwrap_or_else(|e| panic!("{e}"));
    let kv_bytes = vec![3u8; inst.group_page_bytes(&groups[0]) as usize];
    kv.write_group(0, 0, &kv_bytes)
        .unwrap_or_else(|e| panic!("{e}"));
    let st_page = state.reuse(0).unwrap_or_else(|e| panic!("{e}"));
    let st_bytes = vec![4u8; inst.group_page_bytes(&groups[1]) as usize];
    state
        .write_group(0, 1, &st_bytes)
        .unwrap_or_else(|e| panic!("{e}"));
    let page = |group, page| PublishPage {
        group,
        rank: 0,
        hash: hash(0),
        parent: vec![],
        start: 0,
        end: 16,
        page,
    };
    let req = PublishRequest {
        token: s.workers[0].1,
        epoch: s.epoch,
        pages: vec![page(0, kv_page), page(1, st_page), page(1, kv_page)],
    };
    let client = &mut s.workers[0].0;
    let id = client
        .send(&Message::Publish(req))
        .unwrap_or_else(|e| panic!("{e}"));
    match client.reply(id) {
        Ok(Message::PublishCopied { pages }) => assert_eq!(
            pages,
            vec![PageStatus::Ok, PageStatus::Ok, PageStatus::BadGeometry]
        ),
        other => panic!("{other:?}"),
    }
}

#[test]
fn pipeline_stages_of_three_and_two_layers_share_records_byte_exact() {
    let d = Daemon::start();
    let mut inst = SimInstance::new("pp-a", 2);
    inst.layers = 3;
    inst.pipeline_layers = vec![3, 2];
    let groups = inst.groups();
    assert_ne!(
        inst.group_page_bytes_at(&groups[0], 0),
        inst.group_page_bytes_at(&groups[0], 1)
    );
    // Rank 1 registering rank 0's page size is refused.
    let mut s = seal(&d, &inst);
    let (code, detail) = register(&mut s, 1, inst.pool_spec_at(0, 5, 4))
        .err()
        .unwrap_or_else(|| panic!());
    assert_eq!(code, ErrorCode::Malformed);
    assert!(detail.contains("rank 1's format"), "{detail}");
    drop(s);
    let reqs = synthetic(6, 12, 16);
    let run = |inst: SimInstance, publish: bool| {
        let mut opts = EngineOptions::new(d.socket.clone(), inst);
        opts.pool_pages = 32;
        opts.publish = publish;
        let mut e = SimEngine::start(opts).unwrap_or_else(|e| panic!("start: {e}"));
        for r in &reqs {
            e.run(r).unwrap_or_else(|e| panic!("request: {e}"));
        }
        e.report().clone()
    };
    let first = run(inst.clone(), true);
    assert_eq!((first.errors, first.pages.wrong_bytes), (0, 0), "{first:?}");
    inst.name = "pp-b".into();
    let second = run(inst, false);
    assert_eq!(
        (second.errors, second.pages.wrong_bytes, second.unproven),
        (0, 0, 0),
        "{second:?}"
    );
    let with_blocks = reqs.iter().filter(|r| r.len() >= 16).count() as u64;
    assert_eq!(second.hits, with_blocks, "{second:?}");
    assert_eq!(second.proven_tokens, second.requested_tokens);
}

#[test]
fn a_connection_holds_a_bounded_number_of_pools() {
    let d = Daemon::start();
    let inst = SimInstance::new("many-pools", 1);
    let mut s = seal(&d, &inst);
    let whole = inst.pool_spec(1, 2);
    let limit = orbitkv_manager::transfer::MAX_POOLS_PER_CONNECTION as u32;
    let kept: Vec<HostPool> = (0..limit)
        .map(|i| register(&mut s, 0, only(&whole, 0, 100 + i)).unwrap_or_else(|e| panic!("{e:?}")))
        .collect();
    let (code, detail) = register(&mut s, 0, only(&whole, 0, 100 + limit))
        .err()
        .unwrap_or_else(|| panic!("pool {} past the limit registered", limit + 1));
    assert_eq!(code, ErrorCode::LimitExceeded, "{detail}");
    // A pool it holds may still be registered again (a restarted engine's, say): refused
    // only as the same epoch's, not for the count.
    let (code, _) = register(&mut s, 0, only(&whole, 0, 100))
        .err()
        .unwrap_or_else(|| panic!());
    assert_eq!(code, ErrorCode::Malformed);
    drop(kept);
}
