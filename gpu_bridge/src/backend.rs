//! The backend seam: a pool of engine pages the manager can lease and copy into or out of. The
//! host backend ([`crate::host`]) keeps pages in shared memory owned by the engine process; a
//! CUDA backend opens engine KV tensors from IPC handles.

use std::ops::Range;
use std::sync::Arc;

use crate::error::Result;
use crate::pool::{PageRef, PoolSpec};
use crate::staging::Item;

/// A registered pool of engine pages, as the manager sees it.
pub trait PagePool: Send + Sync {
    /// The pool's registration.
    fn spec(&self) -> &PoolSpec;
    /// The session epoch it was registered under.
    fn epoch(&self) -> u64;
    /// Takes a page lease if the page is at `page.generation` (see [`crate::pool::PageState`]).
    fn take_lease(&self, page: PageRef) -> Result<()>;
    /// Gives back a lease on page `index`.
    fn release(&self, index: u32);
    /// The page's generation now.
    fn generation(&self, index: u32) -> Result<u64>;
    /// Copies `bytes` (the layers `layers` of `group`, packed) into the leased page.
    fn copy_in(
        &self,
        lease: &PageLease,
        group: u32,
        layers: Range<u32>,
        bytes: &[u8],
    ) -> Result<()>;
    /// Appends all layers of `group` of the leased page to `out` (packed), then re-checks the
    /// page's generation: a page reused during the copy gives an error and `out` as it was.
    fn copy_out(&self, lease: &PageLease, group: u32, out: &mut Vec<u8>) -> Result<()>;
    /// [`PagePool::copy_out`] for each of `pages` (all of this pool), one result each in order;
    /// a page refused or reused during the copy leaves its `out` as it was. The default copies
    /// page by page; a device pool batches them through its staging memory.
    fn copy_out_many(&self, pages: &mut [CopyOut<'_>]) -> Vec<Result<()>> {
        pages
            .iter_mut()
            .map(|c| self.copy_out(c.lease, c.group, c.out))
            .collect()
    }
    /// Stops all further copies (the engine disconnected); copies in progress finish first.
    fn detach(&self);
    /// The pool's staged Load, for a pool whose pages this process cannot write directly
    /// (device memory); `None` (the default): Loads copy page by page with
    /// [`PagePool::copy_in`].
    fn staged(&self) -> Option<&dyn StagedLoad> {
        None
    }
}

/// One page of a batched copy-out ([`PagePool::copy_out_many`]): the leased page, the group
/// whose layers are copied, and the buffer they are appended to (packed).
pub struct CopyOut<'a> {
    /// The page, leased.
    pub lease: &'a PageLease,
    /// The layout group copied.
    pub group: u32,
    /// Where the layers go.
    pub out: &'a mut Vec<u8>,
}

/// A Load through the pool's staging memory: a batch of pages, each item's bytes written by
/// the caller straight into the staging buffer (the store reads them there), then copied to
/// the pages in batches, an event each.
pub trait StagedLoad {
    /// Copies `items`: `fill(i, dst)` writes item `i`'s packed bytes into `dst`, or returns
    /// `false` (the item is then never copied and gets no `done`); once a batch is filled,
    /// `claim(i)` leases each filled item's page just before its copy is queued, keeping the
    /// lease until told, or returns `false` (not copied, no `done`), so no lease spans a fill; `done(i, r)` reports each other item exactly
    /// once — `Ok` when its copy has completed (its lease may end now), an error when the pool
    /// refused it before filling (fencing). An `Err` return means the copies stopped (the
    /// device failed): every item without a `done` was not copied, and nothing is still in
    /// flight.
    fn load_staged(
        &self,
        items: &[Item],
        fill: &mut dyn FnMut(usize, &mut [u8]) -> bool,
        claim: &mut dyn FnMut(usize) -> bool,
        done: &mut dyn FnMut(usize, Result<()>),
    ) -> Result<()>;
}

/// A page lease: the manager's claim on one engine page while it copies into or out of it. The
/// engine cannot reallocate the page while it is held; dropping it gives the page back (so a
/// client's leases end with its session, whatever way it ends).
pub struct PageLease {
    pool: Arc<dyn PagePool>,
    page: PageRef,
}

impl PageLease {
    /// Takes a lease on `page` of `pool`.
    pub fn take(pool: Arc<dyn PagePool>, page: PageRef) -> Result<Self> {
        pool.spec().check_index(page.index)?;
        pool.take_lease(page)?;
        Ok(Self { pool, page })
    }

    /// The page leased.
    pub fn page(&self) -> PageRef {
        self.page
    }

    /// The pool it is in.
    pub fn pool(&self) -> &Arc<dyn PagePool> {
        &self.pool
    }
}

impl Drop for PageLease {
    fn drop(&mut self) {
        self.pool.release(self.page.index);
    }
}

impl std::fmt::Debug for PageLease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PageLease")
            .field("page", &self.page)
            .finish()
    }
}
