//! The data path through the socket with host pools: blocks' hashes and bytes, pools, Publish,
//! Acquire and Load, a re-registration of a sealed instance on its own connections.

use std::os::fd::AsFd;

use orbitkv_gpu_bridge::{HostPool, PageRef};
use orbitkv_protocol::message::{LoadPage, LoadRequest, PublishPage, PublishRequest};
use orbitkv_protocol::{Message, PageStatus, Role};
use orbitkv_sim::SimInstance;
use orbitkv_state::Namespace;

use super::Sealed;

/// Block `block`'s native hash (parent: block − 1).
pub fn hash(block: u32) -> Vec<u8> {
    let mut h = vec![0u8; 32];
    h[..4].copy_from_slice(&block.to_le_bytes());
    h[31] = 0x5C;
    h
}

/// The bytes block `block` holds (a page of the instance's one group).
pub fn block_bytes(sim: &SimInstance, block: u32) -> Vec<u8> {
    salted_bytes(sim, block, 0)
}

/// Bytes of block `block` as a publisher salted `salt` computes them (so two publishers of the
/// same block can be told apart).
pub fn salted_bytes(sim: &SimInstance, block: u32, salt: u8) -> Vec<u8> {
    (0..sim.page_bytes())
        .map(|i| (i as u32).wrapping_mul(7).wrapping_add(block * 31) as u8 ^ salt)
        .collect()
}

/// Worker 0 registers host pool 1 of 16 pages.
pub fn register_pool(s: &mut Sealed, sim: &SimInstance) -> HostPool {
    register_pool_on(s, sim, 0, 1)
}

/// Worker `worker` registers host pool `id` of 16 pages.
pub fn register_pool_on(s: &mut Sealed, sim: &SimInstance, worker: usize, id: u32) -> HostPool {
    register_pool_of(s, sim, worker, id, 16)
}

/// Worker `worker` registers host pool `id` of `pages` pages.
pub fn register_pool_of(
    s: &mut Sealed,
    sim: &SimInstance,
    worker: usize,
    id: u32,
    pages: u32,
) -> HostPool {
    let pool = HostPool::create(sim.pool_spec(id, pages)).unwrap_or_else(|e| panic!("{e}"));
    let (client, token) = &mut s.workers[worker];
    let req = client
        .send_with_fd(
            &Message::RegisterPool {
                token: *token,
                spec: sim.pool_spec(id, pages),
                memory: orbitkv_gpu_bridge::PageMemory::Host,
            },
            pool.fd().as_fd(),
        )
        .unwrap_or_else(|e| panic!("{e}"));
    let r = client.reply(req).unwrap_or_else(|e| panic!("{e}"));
    assert!(matches!(r, Message::PoolRegistered { .. }), "{r:?}");
    pool
}

/// Reuses page `index` and writes `bytes` into it; its new reference.
pub fn fill_with(pool: &HostPool, index: u32, bytes: &[u8]) -> PageRef {
    let r = pool.reuse(index).unwrap_or_else(|e| panic!("{e}"));
    pool.write(index, 0, bytes)
        .unwrap_or_else(|e| panic!("{e}"));
    r
}

/// Reuses page `index` and writes block `block`'s bytes into it.
pub fn fill(sim: &SimInstance, pool: &HostPool, index: u32, block: u32) -> PageRef {
    fill_with(pool, index, &block_bytes(sim, block))
}

/// The Publish of each `(block, page)` by worker `worker` as rank `rank`.
pub fn publish_request(
    s: &Sealed,
    sim: &SimInstance,
    worker: usize,
    rank: u32,
    pages: &[(u32, PageRef)],
) -> PublishRequest {
    let bt = u64::from(sim.block_tokens);
    PublishRequest {
        token: s.workers[worker].1,
        epoch: s.epoch,
        pages: pages
            .iter()
            .map(|(block, page)| PublishPage {
                group: 0,
                rank,
                hash: hash(*block),
                parent: if *block == 0 { vec![] } else { hash(block - 1) },
                start: u64::from(*block) * bt,
                end: u64::from(block + 1) * bt,
                page: *page,
            })
            .collect(),
    }
}

/// Sends `req` on worker `worker`'s connection; returns both replies (PublishCopied's
/// statuses, then the PublishDurable message).
pub fn publish_replies(
    s: &mut Sealed,
    worker: usize,
    req: PublishRequest,
) -> (Vec<PageStatus>, Message) {
    let client = &mut s.workers[worker].0;
    let id = client
        .send(&Message::Publish(req))
        .unwrap_or_else(|e| panic!("{e}"));
    let copied = match client.reply(id).unwrap_or_else(|e| panic!("{e}")) {
        Message::PublishCopied { pages } => pages,
        other => panic!("{other:?}"),
    };
    (copied, client.reply(id).unwrap_or_else(|e| panic!("{e}")))
}

/// Publishes each `(block, page)` from worker 0; returns the per-page statuses of the copies
/// (the first reply), checking that the second (stored and durable) agrees.
pub fn publish(s: &mut Sealed, sim: &SimInstance, pages: &[(u32, PageRef)]) -> Vec<PageStatus> {
    let req = publish_request(s, sim, 0, 0, pages);
    let (copied, durable) = publish_replies(s, 0, req);
    assert_eq!(
        durable,
        Message::PublishDurable {
            pages: copied.clone(),
            retry_after_ms: 0,
        }
    );
    copied
}

/// The scheduler acquires blocks `0..blocks` up to token `end`: the lease and the boundary.
pub fn acquire(s: &mut Sealed, blocks: u32, end: u64) -> (u64, u64) {
    let q = super::query(s, (0..blocks).map(hash).collect(), end);
    match s.scheduler.request(&Message::Acquire(q)) {
        Ok(Message::Leased { lease, proof, .. }) => (lease, proof.boundary),
        other => panic!("{other:?}"),
    }
}

/// The Load by worker `worker` of each `(block, page, first layer, layer end)` of rank `rank`
/// under `lease`.
pub fn load_request(
    s: &Sealed,
    worker: usize,
    rank: u32,
    lease: u64,
    pages: &[(u32, PageRef, u32, u32)],
) -> LoadRequest {
    LoadRequest {
        token: s.workers[worker].1,
        epoch: s.epoch,
        lease,
        pages: pages
            .iter()
            .map(|(block, page, from, to)| LoadPage {
                block: *block,
                group: 0,
                rank,
                page: *page,
                layer_start: *from,
                layer_end: *to,
            })
            .collect(),
    }
}

/// Worker 0 loads each `(block, page, first layer, layer end)` under `lease`.
pub fn load(s: &mut Sealed, lease: u64, pages: &[(u32, PageRef, u32, u32)]) -> Vec<PageStatus> {
    let req = load_request(s, 0, 0, lease, pages);
    match s.workers[0].0.request(&Message::Load(req)) {
        Ok(Message::Loaded { pages }) => pages,
        other => panic!("{other:?}"),
    }
}

/// Page `index`'s bytes.
pub fn page_bytes(sim: &SimInstance, pool: &HostPool, index: u32) -> Vec<u8> {
    let mut got = vec![0u8; sim.page_bytes() as usize];
    pool.read(index, 0, &mut got)
        .unwrap_or_else(|e| panic!("{e}"));
    got
}

/// Every rank of `s` registers again, on its own connection, as `sim` describes (an engine
/// restarted with another computation, say); `s` takes the new seal's epoch, namespace and
/// tokens.
pub fn reseal(s: &mut Sealed, sim: &SimInstance) {
    let reg = |role, rank| {
        Message::Register(
            sim.registration(role, rank)
                .unwrap_or_else(|e| panic!("{e}")),
        )
    };
    let first = s
        .scheduler
        .send(&reg(Role::Scheduler, 0))
        .unwrap_or_else(|e| panic!("{e}"));
    let mut sent = Vec::new();
    for (rank, (c, _)) in s.workers.iter_mut().enumerate() {
        sent.push(
            c.send(&reg(Role::Worker, rank as u32))
                .unwrap_or_else(|e| panic!("{e}")),
        );
    }
    let sealed = |m: Message| match m {
        Message::Sealed {
            epoch,
            namespace,
            token,
            ..
        } => (epoch, Namespace(namespace), token),
        other => panic!("not sealed: {other:?}"),
    };
    let (epoch, namespace, token) =
        sealed(s.scheduler.reply(first).unwrap_or_else(|e| panic!("{e}")));
    for ((c, t), id) in s.workers.iter_mut().zip(sent) {
        let (e, _, worker_token) = sealed(c.reply(id).unwrap_or_else(|e| panic!("{e}")));
        assert_eq!(e, epoch);
        *t = worker_token;
    }
    s.epoch = epoch;
    s.namespace = namespace;
    s.token = token;
}
