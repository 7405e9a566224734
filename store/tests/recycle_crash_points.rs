//! Crashes while a full direct store writes new segments over reclaimed files: the fault backend
//! halts after its N-th mutating operation (inside a reclaim, the rename to the spare, the new
//! header's write and sync, the rename to the segment's name, an append over the earlier
//! frames), then loses power with torn pages. Every key is put several times, so a frame of a
//! file's earlier life served again would be an older version: for every N, a key is served at
//! its last durable version (or the one being put when the store halted) or not at all, and
//! every durable record the store still indexed when it stopped is served.

mod common;

use std::sync::Arc;

use common::*;
use orbitkv_segments::Alignment;
use orbitkv_store::io::Io;
use orbitkv_store::io::fault::{Crash, FaultIo, FaultPlan};
use orbitkv_store::{Durability, Policy, StateStore, StoreConfig};

const PUTS: u64 = 300;
const KEYS: u64 = 40;

fn store(io: &FaultIo) -> Option<StateStore> {
    let mut c = StoreConfig::new("data");
    c.durability = Durability::EveryPut;
    c.alignment = Alignment::Direct;
    c.ssd_bytes = Some(1 << 20);
    // Recycling is the log policies' (record-lru punches records out instead).
    c.policy = Policy::FifoReinsert;
    c.checkpoint_every = 16;
    let s = StateStore::open(Arc::new(io.clone()) as Arc<dyn Io>, c).ok()?;
    s.register_namespace(NS, info()).ok()?;
    Some(s)
}

fn len(k: u64) -> usize {
    3000 + (k as usize * 311) % 2000
}

/// Put `i`: key `i % KEYS`, version `i / KEYS`.
fn version_bytes(k: u64, v: u64) -> Vec<u8> {
    payload(5 + v, k, len(k))
}

/// The puts, a few keys read between them; returns each key's last durable version and the
/// put in flight when the store halted (key, version).
fn workload(s: &StateStore) -> (Vec<Option<u64>>, Option<(u64, u64)>) {
    let mut durable = vec![None; KEYS as usize];
    let mut out = Vec::new();
    for i in 0..PUTS {
        let (k, v) = (i % KEYS, i / KEYS);
        let p = version_bytes(k, v);
        match s.put(&[(meta(k), p.as_slice())]) {
            Ok(r) if r.durable => durable[k as usize] = Some(v),
            Ok(_) | Err(_) => return (durable, Some((k, v))),
        }
        if i % 8 == 0 {
            for h in 0..3 {
                let _ = s.get(&key(h), &mut out);
            }
        }
    }
    (durable, None)
}

#[test]
fn every_crash_point_over_recycled_files_serves_only_current_versions() {
    let clean = FaultIo::new();
    let s = store(&clean).unwrap();
    clean.set_plan(FaultPlan::default());
    let (durable, halted) = workload(&s);
    assert!(halted.is_none() && durable.iter().all(Option::is_some));
    let st = s.stats();
    assert!(
        st.reclaimed_segments > 5 && st.recycled_segments > 5,
        "{st:?}"
    );
    let total = clean.counters().ops;
    drop(s);

    for n in halt_points(total, 5) {
        let io = FaultIo::new();
        let s = store(&io).unwrap();
        halt_after(&io, n);
        let (durable, halted) = workload(&s);
        let indexed: Vec<bool> = (0..KEYS).map(|k| s.index().contains(&key(k))).collect();
        drop(s);
        io.crash(Crash::TornPages(n));
        let Some(s) = store(&io) else {
            panic!("halt after {n}: the store did not reopen");
        };
        let mut got = Vec::new();
        for k in 0..KEYS {
            let found = s
                .get(&key(k), &mut got)
                .unwrap_or_else(|e| panic!("halt after {n}: {e}"));
            let Some(_) = found else {
                assert!(
                    !(indexed[k as usize] && durable[k as usize].is_some()),
                    "halt after {n}: durable, indexed key {k} lost"
                );
                continue;
            };
            let allowed = durable[k as usize]
                .into_iter()
                .chain(halted.filter(|(hk, _)| *hk == k).map(|(_, v)| v));
            let ok = allowed.into_iter().any(|v| got == version_bytes(k, v));
            assert!(
                ok,
                "halt after {n}: key {k} served bytes of no current version (durable {:?})",
                durable[k as usize]
            );
        }
    }
}
