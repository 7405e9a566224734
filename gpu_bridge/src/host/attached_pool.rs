//! The manager's side of a host pool: the engine's region mapped from the descriptor it passed.
//! Every offset comes from the registration checked at attach time, never from the region.
//! Fencing goes through the pool's [`FencedStates`]; this file holds no `unsafe`.

#![forbid(unsafe_code)]

use std::ops::Range;
use std::os::fd::OwnedFd;
use std::sync::{Arc, RwLock};

use super::engine_memory::EngineMemory;
use super::fenced_states::FencedStates;
use super::layout::Layout;
use super::region::map_registered;
use crate::backend::{PageLease, PagePool};
use crate::error::{Error, Result};
use crate::pool::{PageRef, PoolSpec, generation_of};

/// The manager's side: an engine's pool mapped from the descriptor it passed.
pub struct AttachedPool {
    spec: PoolSpec,
    epoch: u64,
    layout: Layout,
    states: FencedStates,
    /// The pages in memory the engine allocated, apart from the state words' region; `None`:
    /// they follow the words in the region.
    engine_memory: Option<EngineMemory>,
    /// Set once detached; copies hold the read side while they run.
    detached: RwLock<bool>,
}

impl AttachedPool {
    /// Maps the pool region `fd` refers to, registered as `spec` under session `epoch`: the
    /// registration must be valid, the region sealed against shrinking and exactly the size
    /// the registration implies, and its header must agree with the registration.
    pub fn attach(fd: OwnedFd, spec: PoolSpec, epoch: u64) -> Result<Arc<Self>> {
        let (layout, region) = map_registered(fd, &spec, true)?;
        Ok(Arc::new(Self {
            states: FencedStates::new(spec.clone(), region),
            spec,
            epoch,
            layout,
            engine_memory: None,
            detached: RwLock::new(false),
        }))
    }

    /// A pool whose pages are in memory the engine allocated (`memory`, the pages from
    /// `offset`: `pages × page_bytes` bytes, which it must hold now), its state words in the
    /// states-only region `states` (checked as [`FencedStates::attach`] checks it). Memory
    /// sealed against shrinking is mapped; other memory is copied with `pread`/`pwrite`.
    pub fn attach_engine_memory(
        states: OwnedFd,
        memory: OwnedFd,
        offset: u64,
        spec: PoolSpec,
        epoch: u64,
    ) -> Result<Arc<Self>> {
        let (layout, region) = map_registered(states, &spec, false)?;
        let len = u64::from(spec.pages)
            .checked_mul(spec.page_bytes)
            .ok_or_else(|| {
                Error::Geometry("the pool is larger than this machine addresses".into())
            })?;
        let engine_memory = EngineMemory::open(memory, offset, len)?;
        Ok(Arc::new(Self {
            states: FencedStates::new(spec.clone(), region),
            spec,
            epoch,
            layout,
            engine_memory: Some(engine_memory),
            detached: RwLock::new(false),
        }))
    }

    /// Whether copies go through the engine memory's descriptor (`pread`/`pwrite`) rather than
    /// a mapping.
    pub fn copies_through_file(&self) -> bool {
        self.engine_memory
            .as_ref()
            .is_some_and(EngineMemory::copies_through_file)
    }

    /// Copies `bytes` into the page memory at `at`.
    fn write_pages(&self, at: u64, bytes: &[u8]) -> Result<()> {
        match &self.engine_memory {
            Some(m) => m.write(at, bytes),
            None => self
                .states
                .region()
                .write(self.layout.data_offset + at, bytes),
        }
    }

    /// Appends `n` bytes of the page memory at `at` to `out`.
    fn append_pages(&self, at: u64, n: usize, out: &mut Vec<u8>) -> Result<()> {
        match &self.engine_memory {
            Some(m) => m.append(at, n, out),
            None => self
                .states
                .region()
                .append(self.layout.data_offset + at, n, out),
        }
    }

    /// Runs `f` unless detached, holding off a detach until it returns.
    fn attached<R>(&self, f: impl FnOnce() -> Result<R>) -> Result<R> {
        let d = self.detached.read().unwrap_or_else(|e| e.into_inner());
        if *d {
            return Err(Error::Detached {
                pool: self.spec.pool,
            });
        }
        f()
    }

    /// Checks that `lease` is on this pool and the page is still at its generation.
    fn check_lease(&self, lease: &PageLease) -> Result<u64> {
        let page = lease.page();
        let same_pool = std::ptr::addr_eq(Arc::as_ptr(lease.pool()), std::ptr::from_ref(self));
        if !same_pool {
            return Err(Error::UnknownPool { pool: page.pool });
        }
        self.states.check(page)
    }
}

impl PagePool for AttachedPool {
    fn spec(&self) -> &PoolSpec {
        &self.spec
    }

    fn epoch(&self) -> u64 {
        self.epoch
    }

    fn take_lease(&self, page: PageRef) -> Result<()> {
        self.attached(|| {
            if page.pool != self.spec.pool {
                return Err(Error::UnknownPool { pool: page.pool });
            }
            self.states.lease(page)
        })
    }

    fn release(&self, index: u32) {
        self.states.release(index);
    }

    fn generation(&self, index: u32) -> Result<u64> {
        self.states.generation(index)
    }

    fn copy_in(
        &self,
        lease: &PageLease,
        group: u32,
        layers: Range<u32>,
        bytes: &[u8],
    ) -> Result<()> {
        self.attached(|| {
            self.check_lease(lease)?;
            let g = self.spec.group(group)?;
            if layers.start > layers.end || layers.end > g.layers || !g.addresses(&layers) {
                return Err(Error::Geometry(format!(
                    "layers {layers:?} of group {group}, which has {}",
                    g.layers
                )));
            }
            let expected = g.bytes_for(&layers);
            if bytes.len() as u64 != expected {
                return Err(Error::Length {
                    expected,
                    got: bytes.len() as u64,
                });
            }
            let run = g.run_bytes() as usize;
            let runs = g.runs(lease.page().index, layers.clone());
            for (at, chunk) in runs.zip(bytes.chunks_exact(run)) {
                self.write_pages(at, chunk)?;
            }
            Ok(())
        })
    }

    fn copy_out(&self, lease: &PageLease, group: u32, out: &mut Vec<u8>) -> Result<()> {
        let start = out.len();
        let r = self.attached(|| {
            let before = generation_of(self.check_lease(lease)?);
            let g = self.spec.group(group)?;
            let total = usize::try_from(g.bytes_for(&g.all_layers()))
                .map_err(|_| Error::Geometry("group too large".into()))?;
            out.reserve(total);
            let run = g.run_bytes() as usize;
            for at in g.runs(lease.page().index, g.all_layers()) {
                self.append_pages(at, run, out)?;
            }
            self.states.check_unchanged(lease.page(), before)
        });
        if r.is_err() {
            out.truncate(start);
        }
        r
    }

    fn detach(&self) {
        *self.detached.write().unwrap_or_else(|e| e.into_inner()) = true;
    }
}
