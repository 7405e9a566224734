//! The DRAM index against dashmap and papaya in the same run (peers with their default hashers,
//! keyed by the full `StateKey`): lookups, and a 95/5 read/write mix, on two threads over one
//! million resident keys (target: lookups >= 1.0x the faster peer). Also bytes of DRAM per entry
//! at ten million entries (target <= 100), sized from a capacity hint and grown from empty.

use orbitkv_testkit::Xorshift;
use std::hint::black_box;
use std::sync::Arc;
use std::time::Instant;

use criterion::{Criterion, Throughput};
use dashmap::DashMap;
use orbitkv_benches::{Target, record, report};
use orbitkv_index::{Index, Record, Tier};
use orbitkv_state::{
    CacheGroupId, Component, FormatDigest, HashDomain, Namespace, RankSpec, StateKey, TokenRange,
};

const RESIDENT: u64 = 1_000_000;
const THREADS: u64 = 2;

fn key(i: u64) -> Option<StateKey> {
    let mut native = [0u8; 32];
    let h = i.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    native[..8].copy_from_slice(&h.to_le_bytes());
    native[8..16].copy_from_slice(&h.rotate_left(29).to_le_bytes());
    native[16..24].copy_from_slice(&i.to_le_bytes());
    StateKey::new(
        Namespace([5; 32]),
        HashDomain::VllmSha256Cbor,
        &native,
        CacheGroupId((i % 2) as u32),
        Component::DenseKv,
        RankSpec::Rank((i % 4) as u32),
    )
    .ok()
}

fn rec(i: u64, seq: u64) -> Option<Record> {
    Some(Record {
        tier: Tier::Ssd,
        segment: (i % 1000) as u32,
        offset: (i % 100_000) * 8,
        stored_len: 256 << 10,
        range: TokenRange::new(i * 16, i * 16 + 16).ok()?,
        sequence: seq,
        format: FormatDigest([1; 32]),
    })
}

trait Map: Send + Sync + 'static {
    fn get(&self, k: &StateKey) -> Option<Record>;
    fn put(&self, k: &StateKey, r: Record);
}

impl Map for Index {
    fn get(&self, k: &StateKey) -> Option<Record> {
        Index::get(self, k)
    }
    fn put(&self, k: &StateKey, r: Record) {
        let _ = self.insert(k, r);
    }
}

impl Map for DashMap<StateKey, Record> {
    fn get(&self, k: &StateKey) -> Option<Record> {
        DashMap::get(self, k).map(|r| *r)
    }
    fn put(&self, k: &StateKey, r: Record) {
        self.insert(*k, r);
    }
}

impl Map for papaya::HashMap<StateKey, Record> {
    fn get(&self, k: &StateKey) -> Option<Record> {
        self.pin().get(k).copied()
    }
    fn put(&self, k: &StateKey, r: Record) {
        self.pin().insert(*k, r);
    }
}

/// Runs `iters` operations split over [`THREADS`] threads; `write_every` > 0 makes one in that
/// many a write (a newer record for a resident key).
fn run<M: Map>(
    map: &Arc<M>,
    keys: &Arc<Vec<StateKey>>,
    iters: u64,
    write_every: u64,
) -> std::time::Duration {
    let start = Instant::now();
    let hs: Vec<_> = (0..THREADS)
        .map(|t| {
            let (map, keys) = (map.clone(), keys.clone());
            std::thread::spawn(move || {
                let mut x = Xorshift::new(0x2545_f491_4f6c_dd1du64 ^ (t + 1));
                let mut hits = 0u64;
                for n in 0..iters / THREADS {
                    let i = x.below(keys.len() as u64);
                    let k = &keys[i as usize];
                    if write_every > 0 && n % write_every == 0 {
                        if let Some(r) = rec(i, n + 2) {
                            map.put(k, r);
                        }
                    } else if map.get(k).is_some() {
                        hits += 1;
                    }
                }
                hits
            })
        })
        .collect();
    for h in hs {
        black_box(h.join().ok());
    }
    start.elapsed()
}

fn fill<M: Map>(map: &M, keys: &[StateKey]) {
    for (i, k) in keys.iter().enumerate() {
        if let Some(r) = rec(i as u64, 1) {
            map.put(k, r);
        }
    }
}

fn memory() {
    const N: u64 = 10_000_000;
    for (label, hint) in [("capacity hint", N as usize), ("grown from empty", 0)] {
        let index = Index::with_capacity(hint);
        for i in 0..N {
            if let (Some(k), Some(r)) = (key(i), rec(i, 1)) {
                let _ = index.insert(&k, r);
            }
        }
        println!(
            "index memory at {} entries ({label}): {:.1} bytes per entry (target <= 100)",
            index.len(),
            index.memory_bytes() as f64 / index.len().max(1) as f64
        );
    }
}

fn main() {
    memory();
    let keys: Arc<Vec<StateKey>> = Arc::new((0..RESIDENT).filter_map(key).collect());
    let ours = Arc::new(Index::with_capacity(RESIDENT as usize));
    let dash: Arc<DashMap<StateKey, Record>> = Arc::new(DashMap::new());
    let pap: Arc<papaya::HashMap<StateKey, Record>> = Arc::new(papaya::HashMap::new());
    fill(ours.as_ref(), &keys);
    fill(dash.as_ref(), &keys);
    fill(pap.as_ref(), &keys);

    let mut c = Criterion::default().configure_from_args();
    for (group, write_every) in [
        ("index_lookup_2_threads", 0u64),
        ("index_95_5_2_threads", 20),
    ] {
        let mut g = c.benchmark_group(group);
        g.throughput(Throughput::Elements(1));
        g.bench_function("orbitkv_index", |b| {
            b.iter_custom(|iters| {
                record(
                    &format!("{group}/orbitkv"),
                    iters,
                    run(&ours, &keys, iters, write_every),
                )
            })
        });
        g.bench_function("dashmap", |b| {
            b.iter_custom(|iters| {
                record(
                    &format!("{group}/dashmap"),
                    iters,
                    run(&dash, &keys, iters, write_every),
                )
            })
        });
        g.bench_function("papaya", |b| {
            b.iter_custom(|iters| {
                record(
                    &format!("{group}/papaya"),
                    iters,
                    run(&pap, &keys, iters, write_every),
                )
            })
        });
        g.finish();
    }
    c.final_summary();
    for group in ["index_lookup_2_threads", "index_95_5_2_threads"] {
        for peer in ["dashmap", "papaya"] {
            report(
                &format!("{group}: {peer} time / orbitkv time (throughput ratio)"),
                &format!("{group}/orbitkv"),
                &format!("{group}/{peer}"),
                false,
                Target::AtLeast(1.0),
            );
        }
    }
}
