//! A Query or Acquire proves the groups it names: an engine that restores one of a hybrid
//! instance's pools at a time (SGLang moves its KV pages, then each other pool's, in calls of
//! their own) asks for that group alone, and gets the boundary its rule proves; naming every
//! group asks for a boundary where all of them hold.

mod common;

use common::{Daemon, seal};
use orbitkv_protocol::Message;
use orbitkv_protocol::message::{GroupHashes, QueryRequest};
use orbitkv_segments::RecordMeta;
use orbitkv_sim::{SimContract, SimInstance};
use orbitkv_state::{
    CacheGroupId, Component, HashDomain, Namespace, RankSpec, StateKey, TokenRange,
};

fn hash(block: u32) -> Vec<u8> {
    let mut h = vec![0u8; 32];
    h[..4].copy_from_slice(&block.to_le_bytes());
    h[31] = 0xCD;
    h
}

/// Stores the record of `block` in `sim`'s group `group` (spanning `blocks` blocks, ending at
/// the end of `block`), as the engine would have published it.
fn store(d: &Daemon, sim: &SimInstance, ns: Namespace, group: usize, block: u32, blocks: u32) {
    let g = &sim.groups()[group];
    let bt = u64::from(sim.block_tokens);
    let key = |b: u32| {
        StateKey::new(
            ns,
            HashDomain::VllmSha256Cbor,
            &hash(b),
            CacheGroupId(g.id),
            g.component,
            RankSpec::Rank(0),
        )
        .unwrap_or_else(|e| panic!("{e}"))
    };
    let format = sim
        .group_format(g, 0)
        .and_then(|f| f.digest())
        .unwrap_or_else(|e| panic!("{e}"));
    let meta = RecordMeta {
        key: key(block),
        parent: (block > 0).then(|| key(block - 1)),
        range: TokenRange::new(
            u64::from(block + 1 - blocks) * bt,
            u64::from(block + 1) * bt,
        )
        .unwrap_or_else(|e| panic!("{e}")),
        format,
    };
    let payload = vec![block as u8; sim.group_page_bytes(g) as usize];
    d.store
        .put(&[(meta, payload.as_slice())])
        .unwrap_or_else(|e| panic!("{e}"));
}

fn query(s: &common::Sealed, groups: &[u32], blocks: u32, end: u64) -> Message {
    Message::Query(QueryRequest {
        token: s.token,
        epoch: s.epoch,
        origin: 0,
        end,
        groups: groups
            .iter()
            .map(|&group| GroupHashes {
                group,
                hashes: (0..blocks).map(hash).collect(),
            })
            .collect(),
    })
}

#[test]
fn a_query_proves_the_groups_it_names() {
    let d = Daemon::start();
    let mut sim = SimInstance::new("named", 1);
    sim.contract = SimContract::Hybrid;
    let groups = sim.groups();
    assert_eq!(
        groups.iter().map(|g| g.component).collect::<Vec<_>>(),
        vec![Component::SlidingWindowKv, Component::SsmState]
    );
    let (window, state) = (groups[0].id, groups[1].id);
    let mut s = seal(&d, &sim);
    let bt = u64::from(sim.block_tokens);
    let end = 8 * bt;
    // The window's pages of blocks 0..6; no state checkpoint anywhere.
    for b in 0..6 {
        store(&d, &sim, s.namespace, 0, b, 1);
    }
    // Both groups: no boundary holds both.
    match s.scheduler.request(&query(&s, &[window, state], 8, end)) {
        Ok(Message::Miss { detail, .. }) => assert!(detail.contains("checkpoint"), "{detail}"),
        other => panic!("{other:?}"),
    }
    // The window's group alone: its rule holds at 6 blocks.
    match s.scheduler.request(&query(&s, &[window], 8, end)) {
        Ok(Message::Proof(p)) => {
            assert_eq!(p.boundary, 6 * bt);
            assert!(p.loads.iter().all(|l| l.group == window), "{p:?}");
        }
        other => panic!("{other:?}"),
    }
    // A checkpoint at the end of block 3 (spanning the checkpoint grid): both groups now hold
    // at 4 blocks; the state's group alone holds there too.
    let grid = orbitkv_sim::instance::CHECKPOINT_BLOCKS;
    store(&d, &sim, s.namespace, 1, grid - 1, grid);
    for (named, want) in [(vec![window, state], 4 * bt), (vec![state], 4 * bt)] {
        match s.scheduler.request(&query(&s, &named, 8, end)) {
            Ok(Message::Proof(p)) => assert_eq!(p.boundary, want, "{named:?}"),
            other => panic!("{named:?}: {other:?}"),
        }
    }
}
