//! A Load into a pool with staging memory (what a device pool is), through the daemon's Load
//! path with a stand-in device — memory behind a lock, copied to in planned batches through a
//! small staging buffer, fenced by real shared state words: each record is read by the store
//! straight into the staging buffer and lands byte-exact in its page (a layer sub-range too);
//! a record that fails verification, an unpinned record and a stale page reference are never
//! copied and their pages keep their bytes; each page's lease ends when its batch completes,
//! before the next batch is filled.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use orbitkv_gpu_bridge::pool::{check_generation, leases_of};
use orbitkv_gpu_bridge::staging::{Item, copies, plan};
use orbitkv_gpu_bridge::{
    Bridge, FencedStates, GroupGeometry, HostPool, PageLease, PagePool, PageRef, PoolId, PoolSpec,
    StagedLoad,
};
use orbitkv_manager::query::Located;
use orbitkv_protocol::PageStatus;
use orbitkv_protocol::message::LoadPage;
use orbitkv_segments::{FRAME_HEADER_LEN, RecordMeta};
use orbitkv_state::{
    CacheGroupId, Component, FormatDigest, HashDomain, Namespace, RankSpec, StateKey, TokenRange,
};
use orbitkv_store::io::fault::FaultIo;
use orbitkv_store::{Durability, StateStore, StoreConfig};

const LAYERS: u32 = 4;
const LAYER_BYTES: u64 = 64 << 10;
const PAGE: usize = (LAYERS as usize) * (LAYER_BYTES as usize);
const PAGES: u32 = 8;
/// Two pages per batch.
const STAGING: usize = 2 * PAGE;
const NS: Namespace = Namespace([0x42; 32]);
const EPOCH: u64 = 3;
/// What every device page holds before the Load.
const SENTINEL: u8 = 0xEE;

fn spec() -> PoolSpec {
    PoolSpec {
        pool: PoolId(9),
        page_bytes: PAGE as u64,
        pages: PAGES,
        aliased: false,
        groups: vec![GroupGeometry {
            group: 0,
            layers: LAYERS,
            offset: 0,
            layer_stride: LAYER_BYTES,
            layer_bytes: LAYER_BYTES,
            page_stride: PAGE as u64,
            parts: 1,
            part_stride: 0,
            layers_inside: false,
        }],
    }
}

/// A stand-in for device memory with the CUDA pool's staged-load contract.
struct StandInDevice {
    spec: PoolSpec,
    states: FencedStates,
    memory: Mutex<Vec<u8>>,
    /// At the start of each batch: the leases still held on the pages of earlier batches.
    held_before_batch: Mutex<Vec<u32>>,
}

impl PagePool for StandInDevice {
    fn spec(&self) -> &PoolSpec {
        &self.spec
    }
    fn epoch(&self) -> u64 {
        EPOCH
    }
    fn take_lease(&self, page: PageRef) -> orbitkv_gpu_bridge::Result<()> {
        self.states.state(page.index)?.lease(page)
    }
    fn release(&self, index: u32) {
        if let Ok(s) = self.states.state(index) {
            s.release();
        }
    }
    fn generation(&self, index: u32) -> orbitkv_gpu_bridge::Result<u64> {
        Ok(orbitkv_gpu_bridge::pool::generation_of(
            self.states.state(index)?.load(),
        ))
    }
    fn copy_in(
        &self,
        _: &PageLease,
        _: u32,
        _: std::ops::Range<u32>,
        _: &[u8],
    ) -> orbitkv_gpu_bridge::Result<()> {
        panic!("a staged pool's Load must not go page by page")
    }
    fn copy_out(&self, _: &PageLease, _: u32, _: &mut Vec<u8>) -> orbitkv_gpu_bridge::Result<()> {
        panic!("no Publish in this test")
    }
    fn detach(&self) {}
    fn staged(&self) -> Option<&dyn StagedLoad> {
        Some(self)
    }
}

impl StagedLoad for StandInDevice {
    fn load_staged(
        &self,
        items: &[Item],
        fill: &mut dyn FnMut(usize, &mut [u8]) -> bool,
        done: &mut dyn FnMut(usize, orbitkv_gpu_bridge::Result<()>),
    ) -> orbitkv_gpu_bridge::Result<()> {
        let mut staging = vec![0u8; STAGING];
        let mut earlier: Vec<u32> = Vec::new();
        for b in plan(&self.spec, items, STAGING)? {
            let held = earlier
                .iter()
                .map(|&p| leases_of(self.states.state(p).map(|s| s.load()).unwrap_or(0)))
                .sum();
            self.held_before_batch
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(held);
            let mut filled = Vec::new();
            for (j, i) in b.items.clone().enumerate() {
                let page = items[i].page;
                let fenced = self
                    .states
                    .state(page.index)
                    .and_then(|s| check_generation(s.load(), page));
                if let Err(e) = fenced {
                    done(i, Err(e));
                    continue;
                }
                if fill(i, &mut staging[b.staged(j)]) {
                    filled.push((i, b.item_offsets[j]));
                }
            }
            let mut memory = self.memory.lock().unwrap_or_else(|e| e.into_inner());
            for c in copies(&self.spec, filled.iter().map(|&(i, at)| (&items[i], at)))? {
                let at = c.device_offset as usize;
                memory[at..at + c.len]
                    .copy_from_slice(&staging[c.staging_offset..c.staging_offset + c.len]);
            }
            drop(memory);
            for &(i, _) in &filled {
                earlier.push(items[i].page.index);
                done(i, Ok(()));
            }
        }
        Ok(())
    }
}

fn key(i: u64) -> StateKey {
    let mut native = [0u8; 32];
    native[..8].copy_from_slice(&i.wrapping_mul(0x9e37_79b9_7f4a_7c15).to_le_bytes());
    native[8..16].copy_from_slice(&i.to_le_bytes());
    StateKey::new(
        NS,
        HashDomain::VllmSha256Cbor,
        &native,
        CacheGroupId(0),
        Component::DenseKv,
        RankSpec::Rank(0),
    )
    .unwrap_or_else(|e| panic!("{e}"))
}

fn record(i: u64) -> Vec<u8> {
    (0..PAGE)
        .map(|j| (j as u64 ^ i.wrapping_mul(0x2545_f491)).to_le_bytes()[0] ^ (j >> 12) as u8)
        .collect()
}

#[test]
fn staged_pages_come_straight_from_the_store_and_failures_touch_nothing() {
    let io = FaultIo::new();
    let mut config = StoreConfig::new("data");
    config.durability = Durability::EveryPut;
    let store = StateStore::open(Arc::new(io.clone()), config).unwrap();
    store
        .register_namespace(NS, orbitkv_testkit::fixtures::info())
        .unwrap();
    for i in 0..6u64 {
        let p = record(i);
        let meta = RecordMeta {
            key: key(i),
            parent: (i > 0).then(|| key(i - 1)),
            range: TokenRange::new(i * 16, i * 16 + 16).unwrap(),
            format: FormatDigest([3; 32]),
        };
        store.put(&[(meta, p.as_slice())]).unwrap();
    }
    // Record 3 damaged on disk; record 4 unpinned before the Load.
    let rec = store.index().get(&key(3)).unwrap();
    let path = PathBuf::from(format!("data/segments/{:08x}.seg", rec.segment));
    let mut seg = io.read_file(&path).unwrap();
    seg[rec.offset as usize + FRAME_HEADER_LEN + PAGE - 9] ^= 0x01;
    assert!(io.write_file(&path, &seg));
    let pins: Vec<(Located, orbitkv_store::Pin)> = (0..6u64)
        .map(|i| {
            let l = Located {
                group: 0,
                rank: RankSpec::Rank(0),
                block: i as u32,
                key: key(i),
            };
            (l, store.pin(&key(i)).unwrap())
        })
        .collect();
    assert!(store.unpin(pins[4].1));

    let engine = HostPool::create_states(spec()).unwrap();
    let states = FencedStates::attach(engine.fd().try_clone_to_owned().unwrap(), &spec()).unwrap();
    let device = Arc::new(StandInDevice {
        spec: spec(),
        states,
        memory: Mutex::new(vec![SENTINEL; PAGE * PAGES as usize]),
        held_before_batch: Mutex::new(Vec::new()),
    });
    let bridge = Bridge::new();
    bridge.register(device.clone()).unwrap();
    // Page 5 is named at a generation the engine has since moved past.
    let stale = engine.page_ref(5).unwrap();
    engine.reuse(5).unwrap();
    let pages: Vec<LoadPage> = (0..6u32)
        .map(|i| LoadPage {
            block: i,
            group: 0,
            rank: 0,
            page: if i == 5 {
                stale
            } else {
                engine.page_ref(i).unwrap()
            },
            // Page 2 takes layers 1..3 only.
            layer_start: if i == 2 { 1 } else { 0 },
            layer_end: if i == 2 { 3 } else { LAYERS },
        })
        .collect();
    let (statuses, moved) = orbitkv_manager::transfer::load(&store, &bridge, EPOCH, &pins, &pages);
    use PageStatus::*;
    assert_eq!(
        statuses,
        vec![Ok, Ok, Ok, Missing, Missing, StaleGeneration]
    );
    assert_eq!(moved as usize, 2 * PAGE + PAGE / 2);
    let memory = device.memory.lock().unwrap();
    let page = |i: usize| &memory[i * PAGE..(i + 1) * PAGE];
    assert!(page(0) == record(0).as_slice() && page(1) == record(1).as_slice());
    let half = LAYER_BYTES as usize;
    assert!(page(2)[..half].iter().all(|&b| b == SENTINEL));
    assert!(page(2)[half..3 * half] == record(2)[half..3 * half]);
    assert!(page(2)[3 * half..].iter().all(|&b| b == SENTINEL));
    for untouched in 3..PAGES as usize {
        assert!(
            page(untouched).iter().all(|&b| b == SENTINEL),
            "page {untouched} was written"
        );
    }
    // Leases: those of a completed batch were given back before the next batch was filled,
    // and none is left.
    assert!(
        device
            .held_before_batch
            .lock()
            .unwrap()
            .iter()
            .all(|&h| h == 0),
        "{:?}",
        device.held_before_batch.lock().unwrap()
    );
    for i in 0..PAGES {
        assert_eq!(engine.leases(i).unwrap(), 0, "page {i}");
    }
}
