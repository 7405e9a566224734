//! A stand-in for a device pool, for Loads through the daemon's staged path: memory behind a
//! lock, copied to in planned batches through a small staging buffer, fenced by real shared
//! state words. It checks the staged-load contract: a page is leased when its bytes are copied.

use std::sync::Mutex;

use orbitkv_gpu_bridge::pool::{check_generation, leases_of};
use orbitkv_gpu_bridge::staging::{Item, copies, plan};
use orbitkv_gpu_bridge::{
    FencedStates, GroupGeometry, PageLease, PagePool, PageRef, PoolId, PoolSpec, StagedLoad,
};
use orbitkv_manager::query::Located;
use orbitkv_segments::RecordMeta;
use orbitkv_state::{
    CacheGroupId, Component, FormatDigest, HashDomain, Namespace, RankSpec, StateKey, TokenRange,
};
use orbitkv_store::{Pin, StateStore};

pub const LAYERS: u32 = 4;
pub const LAYER_BYTES: u64 = 64 << 10;
pub const PAGE: usize = (LAYERS as usize) * (LAYER_BYTES as usize);
pub const PAGES: u32 = 8;
/// Two pages per batch.
pub const STAGING: usize = 2 * PAGE;
pub const NS: Namespace = Namespace([0x42; 32]);
pub const EPOCH: u64 = 3;
/// What every device page holds before the Load.
pub const SENTINEL: u8 = 0xEE;

pub fn spec() -> PoolSpec {
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
pub struct StandInDevice {
    pub spec: PoolSpec,
    pub states: FencedStates,
    pub memory: Mutex<Vec<u8>>,
    /// At the start of each batch: the leases still held on the pages of earlier batches.
    pub held_before_batch: Mutex<Vec<u32>>,
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
        claim: &mut dyn FnMut(usize) -> bool,
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
            filled.retain(|&(i, _)| claim(i));
            for &(i, _) in &filled {
                let index = items[i].page.index;
                let held = self.states.state(index).map(|s| leases_of(s.load()));
                assert!(
                    matches!(held, Ok(n) if n > 0),
                    "page {index} copied but not leased"
                );
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

pub fn key(i: u64) -> StateKey {
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

pub fn record(i: u64) -> Vec<u8> {
    (0..PAGE)
        .map(|j| (j as u64 ^ i.wrapping_mul(0x2545_f491)).to_le_bytes()[0] ^ (j >> 12) as u8)
        .collect()
}

impl StandInDevice {
    /// A device of [`spec`]'s pages, each holding [`SENTINEL`], fenced by `states`.
    pub fn new(states: FencedStates) -> Self {
        Self {
            spec: spec(),
            states,
            memory: Mutex::new(vec![SENTINEL; PAGE * PAGES as usize]),
            held_before_batch: Mutex::new(Vec::new()),
        }
    }

    /// Page `i`'s bytes now.
    pub fn page(&self, i: usize) -> Vec<u8> {
        let memory = self.memory.lock().unwrap_or_else(|e| e.into_inner());
        memory[i * PAGE..(i + 1) * PAGE].to_vec()
    }
}

/// Puts records `0..n` (a chain, [`record`]'s bytes) into `store`, its namespace registered.
pub fn put_records(store: &StateStore, n: u64) {
    store
        .register_namespace(NS, orbitkv_testkit::fixtures::info())
        .unwrap_or_else(|e| panic!("{e}"));
    for i in 0..n {
        let p = record(i);
        let meta = RecordMeta {
            key: key(i),
            parent: (i > 0).then(|| key(i - 1)),
            range: TokenRange::new(i * 16, i * 16 + 16).unwrap_or_else(|e| panic!("{e}")),
            format: FormatDigest([3; 32]),
        };
        store
            .put(&[(meta, p.as_slice())])
            .unwrap_or_else(|e| panic!("{e}"));
    }
}

/// Records `0..n` pinned, each located as block `i` of group 0, rank 0 (what a lease holds).
pub fn pin_all(store: &StateStore, n: u64) -> Vec<(Located, Pin)> {
    (0..n)
        .map(|i| {
            let l = Located {
                group: 0,
                rank: RankSpec::Rank(0),
                block: i as u32,
                key: key(i),
            };
            let pin = store
                .pin(&key(i))
                .unwrap_or_else(|| panic!("record {i} pinned"));
            (l, pin)
        })
        .collect()
}
