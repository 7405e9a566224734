//! The fencing rules in one place: a request names a session epoch and generation-qualified page
//! references, and a lease (and so any copy) is granted only when the pool is registered, the
//! epoch is the pool's, the index is in range and the page is at the named generation — checked
//! in that order, before anything is read or written. Copies out re-check the generation after
//! copying (see [`PagePool::copy_out`]).

use std::collections::HashMap;
use std::ops::Range;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use crate::backend::{CopyOut, PageLease, PagePool};
use crate::error::{Error, Result};
use crate::pool::{PageRef, PoolId};

/// The pools registered with the manager, by id.
#[derive(Default)]
pub struct Bridge {
    pools: RwLock<HashMap<PoolId, Arc<dyn PagePool>>>,
}

impl Bridge {
    /// An empty bridge.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers `pool`. A pool of the same id from an older epoch (the engine restarted) is
    /// detached and replaced; one from the same or a newer epoch is refused.
    pub fn register(&self, pool: Arc<dyn PagePool>) -> Result<()> {
        let mut pools = self.pools.write().unwrap_or_else(|e| e.into_inner());
        let id = pool.spec().pool;
        if let Some(old) = pools.get(&id) {
            if old.epoch() >= pool.epoch() {
                return Err(Error::StaleEpoch {
                    current: old.epoch(),
                    got: pool.epoch(),
                });
            }
            old.detach();
        }
        pools.insert(id, pool);
        Ok(())
    }

    /// Pools registered now.
    pub fn len(&self) -> usize {
        self.pools.read().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Whether no pool is registered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether a pool `id` is registered.
    pub fn holds(&self, id: PoolId) -> bool {
        self.pools
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .contains_key(&id)
    }

    /// Detaches and forgets pool `id` (its engine disconnected): no copy touches it afterwards.
    pub fn unregister(&self, id: PoolId) {
        let removed = self
            .pools
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&id);
        if let Some(p) = removed {
            p.detach();
        }
    }

    /// Detaches and forgets pool `id` at its engine's request, then waits up to `within` for
    /// the copies still holding it to end, so that its memory is let go (a device pool's
    /// mapping closed) before this returns: `Ok(true)`. `Ok(false)`: a copy still held it when
    /// `within` had passed (no new copy can start).
    pub fn unregister_and_release(&self, id: PoolId, within: Duration) -> Result<bool> {
        let removed = self
            .pools
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&id)
            .ok_or(Error::UnknownPool { pool: id })?;
        removed.detach();
        let deadline = Instant::now() + within;
        while Arc::strong_count(&removed) > 1 {
            if Instant::now() >= deadline {
                return Ok(false);
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        drop(removed);
        Ok(true)
    }

    /// Detaches and forgets every pool (their engine's session ended).
    pub fn detach_all(&self) {
        let pools: Vec<_> = self
            .pools
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .drain()
            .collect();
        for (_, p) in pools {
            p.detach();
        }
    }

    /// The pool `id`.
    pub fn pool(&self, id: PoolId) -> Result<Arc<dyn PagePool>> {
        self.pools
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&id)
            .cloned()
            .ok_or(Error::UnknownPool { pool: id })
    }

    /// Takes a page lease on `page` for a request under `epoch`.
    pub fn lease(&self, epoch: u64, page: PageRef) -> Result<PageLease> {
        let pool = self.pool(page.pool)?;
        if pool.epoch() != epoch {
            return Err(Error::StaleEpoch {
                current: pool.epoch(),
                got: epoch,
            });
        }
        PageLease::take(pool, page)
    }

    /// Copies `bytes` (layers `layers` of `group`) into the leased page.
    pub fn load(
        &self,
        lease: &PageLease,
        group: u32,
        layers: Range<u32>,
        bytes: &[u8],
    ) -> Result<()> {
        lease.pool().copy_in(lease, group, layers, bytes)
    }

    /// Copies `group` out of the leased page into `out` (replacing its contents); an error (and
    /// an empty `out`) when the page was reused during the copy.
    pub fn publish(&self, lease: &PageLease, group: u32, out: &mut Vec<u8>) -> Result<()> {
        out.clear();
        lease.pool().copy_out(lease, group, out)
    }

    /// As [`Bridge::publish`], appending the copy to `out` (a frame's header gap is already
    /// there); on an error `out` is as it was.
    pub fn publish_appending(
        &self,
        lease: &PageLease,
        group: u32,
        out: &mut Vec<u8>,
    ) -> Result<()> {
        lease.pool().copy_out(lease, group, out)
    }

    /// [`Bridge::publish_appending`] for each of `pages`, one result each in order: a run of
    /// pages of one pool is copied in one batched call ([`PagePool::copy_out_many`]).
    pub fn publish_appending_many(&self, pages: &mut [CopyOut<'_>]) -> Vec<Result<()>> {
        let mut results = Vec::with_capacity(pages.len());
        let mut rest = pages;
        while let Some(first) = rest.first() {
            let pool = first.lease.pool().clone();
            let run = rest
                .iter()
                .take_while(|c| Arc::ptr_eq(c.lease.pool(), &pool))
                .count();
            let (now, later) = rest.split_at_mut(run);
            results.extend(pool.copy_out_many(now));
            rest = later;
        }
        results
    }
}
