//! A pool's page state words in shared memory, and the fencing done with them.
//! This is the one fenced-state type: host pools (both sides) and CUDA pools each hold one.
//! A lease is taken only at the page's current generation ([`PageState::lease`]).
//! A copy is checked before it starts ([`FencedStates::check`]) and a copy out again after it ends.
//! The words are reached through the mapping's atomic view, so this file holds no `unsafe`.

#![forbid(unsafe_code)]

use std::os::fd::OwnedFd;
use std::sync::atomic::{Ordering, fence};

use super::layout::word_at;
use super::region::{Region, map_registered};
use crate::error::{Error, Result};
use crate::pool::{PageRef, PageState, PoolSpec, check_generation, generation_of, leases_of};

/// The page state words of one pool (generation and leases, one atomic word a page), shared by
/// the engine and the manager through a mapped region. A host pool's region holds its pages
/// after the words; a device pool's region holds the words only ([`HostPool::create_states`]),
/// and the manager maps it with [`FencedStates::attach`].
///
/// [`HostPool::create_states`]: crate::HostPool::create_states
pub struct FencedStates {
    spec: PoolSpec,
    region: Region,
}

impl FencedStates {
    /// Maps the states-only region `fd` refers to, registered as `spec`: checked like a host
    /// pool's region (sealed, sized by the registration, its header agreeing).
    pub fn attach(fd: OwnedFd, spec: &PoolSpec) -> Result<Self> {
        let (_, region) = map_registered(fd, spec, false)?;
        Ok(Self::new(spec.clone(), region))
    }

    /// The words of `spec`'s pool in `region`, mapped and checked by the caller.
    pub(crate) fn new(spec: PoolSpec, region: Region) -> Self {
        Self { spec, region }
    }

    /// The mapping the words are in (a host pool's pages are in it too).
    pub(crate) fn region(&self) -> &Region {
        &self.region
    }

    /// The registration the words were mapped for.
    pub(crate) fn spec(&self) -> &PoolSpec {
        &self.spec
    }

    /// Page `index`'s state word.
    pub fn state(&self, index: u32) -> Result<PageState<'_>> {
        self.spec.check_index(index)?;
        self.region
            .word(word_at(index))
            .map(PageState)
            .ok_or_else(|| Error::Region("state word outside the region".into()))
    }

    /// Checks that `page` is one of this pool's pages, still at its generation; the state word
    /// read.
    pub fn check(&self, page: PageRef) -> Result<u64> {
        if page.pool != self.spec.pool {
            return Err(Error::UnknownPool { pool: page.pool });
        }
        let word = self.state(page.index)?.load();
        check_generation(word, page)?;
        Ok(word)
    }

    /// Takes a lease on `page` if it is at `page.generation`.
    pub(crate) fn lease(&self, page: PageRef) -> Result<()> {
        self.state(page.index)?.lease(page)
    }

    /// Gives back one lease on page `index` (an index out of range is ignored).
    pub(crate) fn release(&self, index: u32) {
        if let Ok(s) = self.state(index) {
            s.release();
        }
    }

    /// Page `index`'s generation now.
    pub(crate) fn generation(&self, index: u32) -> Result<u64> {
        Ok(generation_of(self.state(index)?.load()))
    }

    /// The leases held on page `index` now.
    pub(crate) fn leases(&self, index: u32) -> Result<u32> {
        Ok(leases_of(self.state(index)?.load()))
    }

    /// After a copy out of `page`: an error unless the page is still at generation `before`
    /// (the one read before copying), so a page reused during the copy is not kept.
    pub(crate) fn check_unchanged(&self, page: PageRef, before: u64) -> Result<()> {
        // Seqlock-style: the copy's reads happen before the generation is read again.
        fence(Ordering::Acquire);
        let after = self.generation(page.index)?;
        if after != before {
            return Err(Error::ChangedDuringCopy {
                pool: self.spec.pool,
                index: page.index,
                before,
                after,
            });
        }
        Ok(())
    }

    /// A reference to page `index` at its current generation.
    pub(crate) fn page_ref(&self, index: u32) -> Result<PageRef> {
        Ok(self.at(index, self.generation(index)?))
    }

    /// The engine reallocates page `index` (refused while leased); the new reference.
    pub(crate) fn reuse(&self, index: u32) -> Result<PageRef> {
        let generation = self.state(index)?.reuse(self.spec.pool, index)?;
        Ok(self.at(index, generation))
    }

    /// The engine reallocates page `index` even while leased (a misbehaving engine, in tests).
    pub(crate) fn reuse_ignoring_leases(&self, index: u32) -> Result<PageRef> {
        let generation = self.state(index)?.reuse_ignoring_leases();
        Ok(self.at(index, generation))
    }

    fn at(&self, index: u32, generation: u64) -> PageRef {
        PageRef {
            pool: self.spec.pool,
            index,
            generation,
        }
    }
}

impl std::fmt::Debug for FencedStates {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FencedStates")
            .field("pool", &self.spec.pool)
            .field("pages", &self.spec.pages)
            .finish()
    }
}
