//! Regression for Mooncake #850 (a transfer still running when its lease ran out read memory the
//! store had reused), through the daemon: a Load still copying when its lease's TTL passes — its
//! pins given back mid-Load while compaction rewrites and deletes every unpinned segment without
//! pause — never reads a segment that compaction or reclaim has reused. Every page of such a
//! Load is either the published bytes exactly (`Ok`) or untouched (`Missing`).

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::pages::{
    fill_with, hash, load_request, page_bytes, publish_replies, publish_request, register_pool_of,
    salted_bytes,
};
use common::{Daemon, seal};
use orbitkv_protocol::client::ClientError;
use orbitkv_protocol::message::{GroupHashes, QueryRequest};
use orbitkv_protocol::{ErrorCode, Message, PageStatus};
use orbitkv_sim::SimInstance;
use orbitkv_store::{StateStore, StoreConfig};

/// Blocks per Load.
const N: u32 = 128;
const SENTINEL: u8 = 0xC3;

#[test]
fn mooncake_850_a_load_past_its_lease_ttl_never_reads_a_reused_segment() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let mut c = StoreConfig::new(dir.path().join("data"));
    c.durability = orbitkv_store::Durability::Manual;
    c.segment_bytes = 4 << 20;
    let io: Arc<dyn orbitkv_store::io::Io> = Arc::new(orbitkv_store::io::std_io::StdIo);
    let store = Arc::new(StateStore::open(io, c).unwrap_or_else(|e| panic!("{e}")));
    let d = Daemon::serve(store, dir, |c| c.lease_ttl = Duration::from_millis(1));
    // 128 KiB pages: a Load of N of them outlasts the lease's TTL.
    let mut sim = SimInstance::new("mooncake-850", 1);
    sim.kv_heads = 8;
    sim.head_size = 128;
    let mut s = seal(&d, &sim);
    let src = register_pool_of(&mut s, &sim, 0, 1, N);
    let dst = register_pool_of(&mut s, &sim, 0, 2, N);
    // Compaction without pause: every unpinned sealed segment rewritten and deleted.
    let stop = Arc::new(AtomicBool::new(false));
    let compactor = {
        let (store, stop) = (d.store.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut rounds = 0u64;
            while !stop.load(Ordering::Acquire) {
                let sealed: Vec<u64> = store
                    .segments()
                    .into_iter()
                    .filter(|(_, sealed)| *sealed)
                    .map(|(id, _)| id)
                    .collect();
                store.compact(&sealed).unwrap_or_else(|e| panic!("{e}"));
                rounds += 1;
                // A breath between rounds, so Publishes get the store's lock too.
                std::thread::sleep(Duration::from_millis(20));
            }
            rounds
        })
    };
    let (mut expired_mid_load, mut pages_ok, mut pages_missing) = (0, 0, 0);
    for round in 0..60u32 {
        let first = round * N;
        let pages: Vec<_> = (0..N)
            .map(|i| {
                (
                    first + i,
                    fill_with(&src, i, &salted_bytes(&sim, first + i, 0)),
                )
            })
            .collect();
        let req = publish_request(&s, &sim, 0, 0, &pages);
        let (_, durable) = publish_replies(&mut s, 0, req);
        assert!(matches!(durable, Message::PublishDurable { .. }));
        let dsts: Vec<_> = (0..N)
            .map(|i| fill_with(&dst, i, &vec![SENTINEL; sim.page_bytes() as usize]))
            .collect();
        let q = QueryRequest {
            token: s.token,
            epoch: s.epoch,
            origin: u64::from(first) * 16,
            end: u64::from(first + N) * 16,
            groups: vec![GroupHashes {
                group: 0,
                hashes: (first..first + N).map(hash).collect(),
            }],
        };
        let lease = match s.scheduler.request(&Message::Acquire(q)) {
            Ok(Message::Leased { lease, proof, .. }) => {
                assert_eq!(proof.boundary, u64::from(first + N) * 16);
                lease
            }
            other => panic!("{other:?}"),
        };
        let load: Vec<_> = dsts
            .iter()
            .enumerate()
            .map(|(i, p)| (i as u32, *p, 0, 2))
            .collect();
        let req = load_request(&s, 0, 0, lease, &load);
        let statuses = match s.workers[0].0.request(&Message::Load(req)) {
            Ok(Message::Loaded { pages }) => pages,
            // The lease ran out before the Load began.
            Err(ClientError::Refused {
                code: ErrorCode::UnknownLease,
                ..
            }) => continue,
            other => panic!("{other:?}"),
        };
        for (i, st) in statuses.iter().enumerate() {
            let got = page_bytes(&sim, &dst, i as u32);
            match st {
                PageStatus::Ok => {
                    pages_ok += 1;
                    assert!(
                        got == salted_bytes(&sim, first + i as u32, 0),
                        "round {round} page {i}: bytes other than the published ones"
                    );
                }
                PageStatus::Missing => {
                    pages_missing += 1;
                    assert!(
                        got.iter().all(|x| *x == SENTINEL),
                        "round {round} page {i}: a missing record wrote into the page"
                    );
                }
                other => panic!("round {round} page {i}: {other:?}"),
            }
        }
        if statuses.contains(&PageStatus::Missing) {
            expired_mid_load += 1;
            if expired_mid_load >= 3 {
                break;
            }
        }
    }
    stop.store(true, Ordering::Release);
    let rounds = compactor
        .join()
        .unwrap_or_else(|_| panic!("the compactor panicked"));
    eprintln!(
        "{expired_mid_load} Loads outlived their lease ({pages_ok} pages ok, {pages_missing} missing); {rounds} compaction rounds"
    );
    assert!(
        expired_mid_load > 0,
        "no lease ran out while its Load copied: the test checked nothing"
    );
    assert!(rounds > 0);
}
