//! SSD admission through the daemon: once the store's SSD tier is full, pages published for the
//! first time come back `held` in PublishDurable (stored in DRAM, not durable), never `ok`; a
//! held page is proven by a Query, acquired and loaded byte-exact like any other; the metrics
//! count it.

mod common;

use std::sync::Arc;

use common::pages::{block_bytes, fill, hash, page_bytes, publish_replies, publish_request};
use common::{Daemon, seal};
use orbitkv_gpu_bridge::PageRef;
use orbitkv_protocol::message::{GroupHashes, QueryRequest};
use orbitkv_protocol::{Message, PageStatus};
use orbitkv_sim::SimInstance;
use orbitkv_store::{Admission, Durability, MIN_SSD_BYTES, Policy, StateStore, StoreConfig};

/// A store as `orbitkv serve` opens it, with the smallest SSD budget and adaptive admission.
fn admitting_store(dir: &std::path::Path) -> Arc<StateStore> {
    let mut c = StoreConfig::new(dir);
    c.durability = Durability::Group;
    c.ssd_bytes = Some(MIN_SSD_BYTES);
    c.policy = Policy::RecordLru;
    c.admission = Admission::Adaptive {
        waiting_bytes: MIN_SSD_BYTES / 10,
    };
    let io: Arc<dyn orbitkv_store::io::Io> = Arc::new(orbitkv_store::io::std_io::StdIo);
    Arc::new(StateStore::open(io, c).unwrap_or_else(|e| panic!("{e}")))
}

#[test]
fn pages_held_back_are_answered_held_and_load_byte_exact() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let store = admitting_store(&dir.path().join("data"));
    let d = Daemon::on(store);
    let sim = SimInstance::new("engine-adm", 1);
    let mut s = seal(&d, &sim);
    let pool = common::pages::register_pool(&mut s, &sim);
    // One-shot traffic: 1,200 blocks of one chain, 8 a Publish, far past the SSD budget.
    let mut held = Vec::new();
    for first in (0..1_200u32).step_by(8) {
        let pages: Vec<(u32, PageRef)> = (0..8)
            .map(|i| (first + i, fill(&sim, &pool, i, first + i)))
            .collect();
        let req = publish_request(&s, &sim, 0, 0, &pages);
        let (copied, durable) = publish_replies(&mut s, 0, req);
        assert_eq!(copied, vec![PageStatus::Ok; 8]);
        let Message::PublishDurable { pages: st, .. } = durable else {
            panic!("{durable:?}")
        };
        for (i, status) in st.iter().enumerate() {
            match status {
                PageStatus::Held => held.push(first + i as u32),
                PageStatus::Ok => {}
                other => panic!("block {}: {other:?}", first + i as u32),
            }
        }
    }
    assert!(held.len() > 400, "{} held", held.len());
    assert_eq!(d.store.stats().held_records, held.len() as u64);
    // The last block held is still waiting: a Query from its first token proves it.
    let b = *held.last().unwrap_or_else(|| panic!("none held"));
    let bt = u64::from(sim.block_tokens);
    let q = QueryRequest {
        token: s.token,
        epoch: s.epoch,
        origin: u64::from(b) * bt,
        end: u64::from(b + 1) * bt,
        groups: vec![GroupHashes {
            group: 0,
            hashes: vec![hash(b)],
        }],
    };
    let lease = match s.scheduler.request(&Message::Acquire(q)) {
        Ok(Message::Leased { lease, proof, .. }) => {
            assert_eq!(proof.boundary, u64::from(b + 1) * bt);
            lease
        }
        other => panic!("{other:?}"),
    };
    let dst = pool.reuse(9).unwrap_or_else(|e| panic!("{e}"));
    let st = common::pages::load(&mut s, lease, &[(0, dst, 0, 2)]);
    assert_eq!(st, vec![PageStatus::Ok]);
    assert_eq!(page_bytes(&sim, &pool, 9), block_bytes(&sim, b));
    let text = match s.scheduler.request(&Message::Stats) {
        Ok(Message::StatsReply { text }) => text,
        other => panic!("{other:?}"),
    };
    assert!(
        text.contains(&format!("orbitkv_store_held_records_total {}", held.len())),
        "{text}"
    );
}
