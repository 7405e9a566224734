//! Sessions as real engines open them, through the daemon: a vLLM worker registers long before
//! its scheduler exists (the scheduler is built after CUDA-graph warm-up) and its connection is
//! neither closed nor refused while it waits; an SGLang-like instance has no scheduler at all,
//! its workers seal alone and Query, Acquire, Load and Release themselves.

mod common;

use std::time::{Duration, Instant};

use common::Daemon;
use common::pages::{block_bytes, hash};
use orbitkv_gpu_bridge::{HostPool, PageMemory, PageRef};
use orbitkv_protocol::client::Client;
use orbitkv_protocol::message::{
    GroupHashes, LoadPage, LoadRequest, PublishPage, PublishRequest, QueryRequest,
};
use orbitkv_protocol::{Message, PageStatus, Role};
use orbitkv_sim::SimInstance;

#[test]
fn a_worker_registered_a_minute_before_its_scheduler_is_sealed() {
    let d = Daemon::start();
    let mut sim = SimInstance::new("late-scheduler", 1);
    sim.seal_timeout_ms = 15 * 60 * 1000;
    let mut worker = Client::connect(&d.socket).unwrap_or_else(|e| panic!("{e}"));
    let reg = sim
        .registration(Role::Worker, 0)
        .unwrap_or_else(|e| panic!("{e}"));
    let id = worker
        .register_nowait(reg)
        .unwrap_or_else(|e| panic!("{e}"));
    let started = Instant::now();
    std::thread::sleep(Duration::from_secs(61));
    let mut scheduler = Client::connect(&d.socket).unwrap_or_else(|e| panic!("{e}"));
    let s = scheduler
        .register(
            sim.registration(Role::Scheduler, 0)
                .unwrap_or_else(|e| panic!("{e}")),
        )
        .unwrap_or_else(|e| panic!("{e}"));
    let w = worker.await_seal(id).unwrap_or_else(|e| panic!("{e}"));
    assert!(started.elapsed() >= Duration::from_secs(61));
    assert_eq!((w.epoch, w.namespace), (s.epoch, s.namespace));
    // The worker's connection serves as any other.
    let pool = HostPool::create(sim.pool_spec(1, 2)).unwrap_or_else(|e| panic!("{e}"));
    worker
        .register_pool(w.token, sim.pool_spec(1, 2), PageMemory::Host, pool.fd())
        .unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn an_instance_without_a_scheduler_seals_and_its_workers_serve_themselves() {
    let d = Daemon::start();
    let mut sim = SimInstance::new("no-scheduler", 2);
    sim.no_scheduler = true;
    let mut clients: Vec<Client> = (0..2)
        .map(|_| Client::connect(&d.socket).unwrap_or_else(|e| panic!("{e}")))
        .collect();
    let ids: Vec<u64> = clients
        .iter_mut()
        .enumerate()
        .map(|(r, c)| {
            let reg = sim
                .registration(Role::Worker, r as u32)
                .unwrap_or_else(|e| panic!("{e}"));
            c.register_nowait(reg).unwrap_or_else(|e| panic!("{e}"))
        })
        .collect();
    let seals: Vec<_> = clients
        .iter_mut()
        .zip(ids)
        .map(|(c, id)| c.await_seal(id).unwrap_or_else(|e| panic!("{e}")))
        .collect();
    // A scheduler is refused for it.
    let mut sched = Client::connect(&d.socket).unwrap_or_else(|e| panic!("{e}"));
    let r = sched.register(
        sim.registration(Role::Scheduler, 0)
            .unwrap_or_else(|e| panic!("{e}")),
    );
    assert!(r.is_err(), "{r:?}");
    // Each worker publishes block 0 of its rank.
    let mut pools = Vec::new();
    for (r, (c, s)) in clients.iter_mut().zip(&seals).enumerate() {
        let pool = HostPool::create(sim.pool_spec(1, 2)).unwrap_or_else(|e| panic!("{e}"));
        c.register_pool(s.token, sim.pool_spec(1, 2), PageMemory::Host, pool.fd())
            .unwrap_or_else(|e| panic!("{e}"));
        let page = pool.reuse(0).unwrap_or_else(|e| panic!("{e}"));
        pool.write(0, 0, &block_bytes(&sim, r as u32))
            .unwrap_or_else(|e| panic!("{e}"));
        let req = PublishRequest {
            token: s.token,
            epoch: s.epoch,
            pages: vec![PublishPage {
                group: 0,
                rank: r as u32,
                hash: hash(0),
                parent: vec![],
                start: 0,
                end: 16,
                page,
            }],
        };
        let id = c
            .send(&Message::Publish(req))
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(matches!(c.reply(id), Ok(Message::PublishCopied { .. })));
        match c.reply(id) {
            Ok(Message::PublishDurable { pages, .. }) => assert_eq!(pages, vec![PageStatus::Ok]),
            other => panic!("{other:?}"),
        }
        pools.push(pool);
    }
    // Worker 0 acquires both ranks' records; each worker loads its own; worker 0 releases.
    let query = QueryRequest {
        token: seals[0].token,
        epoch: seals[0].epoch,
        origin: 0,
        end: 16,
        groups: vec![GroupHashes {
            group: 0,
            hashes: vec![hash(0)],
        }],
    };
    let lease = match clients[0].request(&Message::Acquire(query)) {
        Ok(Message::Leased { lease, proof, .. }) => {
            assert_eq!(proof.boundary, 16);
            lease
        }
        other => panic!("{other:?}"),
    };
    for (r, (c, s)) in clients.iter_mut().zip(&seals).enumerate() {
        let page: PageRef = pools[r].reuse(1).unwrap_or_else(|e| panic!("{e}"));
        let req = LoadRequest {
            token: s.token,
            epoch: s.epoch,
            lease,
            pages: vec![LoadPage {
                block: 0,
                group: 0,
                rank: r as u32,
                page,
                layer_start: 0,
                layer_end: sim.layers,
            }],
        };
        match c.request(&Message::Load(req)) {
            Ok(Message::Loaded { pages }) => assert_eq!(pages, vec![PageStatus::Ok]),
            other => panic!("{other:?}"),
        }
        let mut got = vec![0u8; sim.page_bytes() as usize];
        pools[r]
            .read(1, 0, &mut got)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(got, block_bytes(&sim, r as u32), "rank {r}");
    }
    clients[0]
        .release(seals[0].token, lease)
        .unwrap_or_else(|e| panic!("{e}"));
}
