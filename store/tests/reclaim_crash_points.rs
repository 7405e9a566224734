//! Crashes while the SSD tier reclaims segments: the fault backend halts after its N-th mutating
//! operation (inside a copy forward, its sync, the manifest's deletion record, the unlink), then
//! loses power with torn pages. For every N: every record whose put returned durable and that the
//! store still indexed when it stopped is served byte-exact after reopening, and nothing is ever
//! served with different bytes.

mod common;

use std::sync::Arc;

use common::*;
use orbitkv_store::io::Io;
use orbitkv_store::io::fault::{Crash, FaultIo, FaultPlan};
use orbitkv_store::{Durability, Policy, StateStore, StoreConfig};

const PUTS: u64 = 330;
const HOT: u64 = 6;

fn store(io: &FaultIo) -> Option<StateStore> {
    let mut c = StoreConfig::new("data");
    c.durability = Durability::EveryPut;
    c.ssd_bytes = Some(1 << 20);
    c.policy = Policy::S3Fifo;
    c.checkpoint_every = 16;
    let s = StateStore::open(Arc::new(io.clone()) as Arc<dyn Io>, c).ok()?;
    s.register_namespace(NS, info()).ok()?;
    Some(s)
}

fn len(i: u64) -> usize {
    3000 + (i as usize * 311) % 2000
}

/// Puts that overflow the budget, with a few records read between them so that reclaiming
/// copies them forward. Returns the records whose put returned durable.
fn workload(s: &StateStore) -> Vec<u64> {
    let mut durable = Vec::new();
    let mut out = Vec::new();
    for i in 0..PUTS {
        let p = payload(5, i, len(i));
        match s.put(&[(meta(i), p.as_slice())]) {
            Ok(r) if r.durable => durable.push(i),
            Ok(_) => {}
            Err(_) => return durable,
        }
        if i % 8 == 0 {
            for h in 0..HOT.min(i) {
                let _ = s.get(&key(h), &mut out);
            }
        }
    }
    durable
}

#[test]
fn every_crash_point_while_reclaiming_keeps_indexed_durable_records() {
    let clean = FaultIo::new();
    let s = store(&clean).unwrap();
    clean.set_plan(FaultPlan::default());
    assert_eq!(workload(&s).len() as u64, PUTS);
    let st = s.stats();
    assert!(
        st.reclaimed_segments > 5 && st.reinserted_records > 0,
        "{st:?}"
    );
    let total = clean.counters().ops;
    drop(s);

    // Every operation of the first reclaims, then a stride through the rest.
    for n in halt_points(total, 7) {
        let io = FaultIo::new();
        let s = store(&io).unwrap();
        halt_after(&io, n);
        let durable = workload(&s);
        let must_survive: Vec<u64> = durable
            .iter()
            .copied()
            .filter(|&i| s.index().contains(&key(i)))
            .collect();
        drop(s);
        io.crash(Crash::TornPages(n));
        let Some(s) = store(&io) else {
            panic!("halt after {n}: the store did not reopen");
        };
        for i in 0..PUTS {
            match check(&s, 5, i, len(i)) {
                Some(false) => panic!("halt after {n}: record {i} with different bytes"),
                Some(true) => {}
                None => assert!(
                    !must_survive.contains(&i),
                    "halt after {n}: durable, indexed record {i} lost"
                ),
            }
        }
    }
}
