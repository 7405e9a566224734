//! Crashes inside every multi-step update: the fault backend halts the "process" after its N-th
//! mutating operation (so the crash lands inside segment creation, sealing, checkpoints,
//! retirement), then loses power with torn pages. For every N: every record whose put returned
//! durable is served byte-exact after reopening, nothing is ever served with different bytes, and
//! an acknowledged retirement holds.

mod common;

use std::sync::Arc;

use common::*;
use orbitkv_store::io::Io;
use orbitkv_store::io::fault::{Crash, FaultIo, FaultPlan};
use orbitkv_store::{Durability, StateStore};

fn store(io: &FaultIo) -> Option<StateStore> {
    let mut c = config(16 << 10, Durability::EveryPut);
    c.checkpoint_every = 6;
    let s = StateStore::open(Arc::new(io.clone()) as Arc<dyn Io>, c).ok()?;
    s.register_namespace(NS, info()).ok()?;
    Some(s)
}

fn len(i: u64) -> usize {
    900 + (i as usize * 311) % 5000
}

/// What the workload was told.
struct Outcome {
    /// Records whose put returned durable.
    durable: Vec<u64>,
    /// The retirement was attempted (it may have taken effect even if it failed).
    retire_attempted: bool,
    /// The retirement was acknowledged.
    retired: bool,
}

/// The workload: puts across several segments, a retirement in the middle, more puts.
fn workload(s: &StateStore) -> Outcome {
    let mut o = Outcome {
        durable: Vec::new(),
        retire_attempted: false,
        retired: false,
    };
    for i in 0..40u64 {
        if i == 25 {
            o.retire_attempted = true;
            match s.retire_namespace(NS) {
                Ok(_) => o.retired = true,
                Err(_) => return o,
            }
        }
        let p = payload(77, i, len(i));
        match s.put(&[(meta(i), p.as_slice())]) {
            Ok(r) if r.durable => o.durable.push(i),
            Ok(_) => {}
            Err(_) => return o,
        }
    }
    o
}

#[test]
fn every_crash_point_keeps_acknowledged_records_and_retirements() {
    // Count the operations of a clean run.
    let clean = FaultIo::new();
    let s = store(&clean).unwrap();
    clean.set_plan(FaultPlan::default());
    let all = workload(&s);
    assert!(all.retired && all.durable.len() == 40);
    let total = clean.counters().ops;
    drop(s);
    assert!(total > 100, "{total} operations");

    for n in 1..=total {
        let io = FaultIo::new();
        let s = store(&io).unwrap();
        io.set_plan(FaultPlan {
            halt_after_ops: Some(n),
            ..Default::default()
        });
        let o = workload(&s);
        drop(s);
        io.crash(Crash::TornPages(n));
        let Some(s) = store(&io) else {
            panic!("halt after {n}: the store did not reopen");
        };
        for i in 0..40u64 {
            match check(&s, 77, i, len(i)) {
                Some(false) => panic!("halt after {n}: record {i} with different bytes"),
                Some(true) => {
                    assert!(
                        !(o.retired && i < 25),
                        "halt after {n}: retired record {i} served"
                    );
                }
                None => {
                    // Lost only if it was never durable, or a retirement covering it was tried.
                    let may_be_retired = o.retire_attempted && i < 25;
                    assert!(
                        !o.durable.contains(&i) || may_be_retired,
                        "halt after {n}: durable record {i} lost"
                    );
                }
            }
        }
    }
}
