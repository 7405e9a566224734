//! The engine's side of a host pool: the region it creates, owns and writes pages into.
//! The region is a sealed memfd, so its size can never change under the manager.
//! Its `unsafe` is the memfd and seal calls, which have no safe wrapper.

use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use super::fenced_states::FencedStates;
use super::layout::Layout;
use super::region::Region;
use crate::error::{Error, Result, os_err};
use crate::pool::{GroupGeometry, PageRef, PoolSpec};

/// A new memfd named `name` (`flags` beside close-on-exec) of `len` bytes (sized for `what`),
/// with `seals` added when not 0.
#[expect(unsafe_code, reason = "memfd_create and fcntl have no safe wrapper")]
fn memfd(
    name: &std::ffi::CStr,
    flags: libc::c_uint,
    len: u64,
    seals: libc::c_int,
    what: &'static str,
) -> Result<File> {
    // SAFETY: memfd_create reads the NUL-terminated name and returns a new descriptor.
    let raw = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | flags) };
    if raw < 0 {
        return Err(os_err("memfd_create"));
    }
    // SAFETY: `raw` is a descriptor just returned to us and owned by nothing else.
    let file = File::from(unsafe { OwnedFd::from_raw_fd(raw) });
    file.set_len(len)
        .map_err(|source| Error::Io { what, source })?;
    // SAFETY: fcntl on the descriptor just made, with integer arguments only.
    if seals != 0 && unsafe { libc::fcntl(file.as_raw_fd(), libc::F_ADD_SEALS, seals) } != 0 {
        return Err(os_err("sealing the memfd"));
    }
    Ok(file)
}

/// An unsealed memfd of `len` bytes: memory as an engine's own allocator hands it over
/// (SGLang's `allocator: shm`), for a pool registered with [`crate::PageMemory::Engine`].
pub fn engine_memory(len: u64) -> Result<File> {
    memfd(
        c"orbitkv-engine-memory",
        0,
        len,
        0,
        "sizing the engine memory",
    )
}

/// A memfd of hugetlbfs of `len` bytes, sealed against shrinking and growing, for tests of
/// its refusal (no huge page is touched: the machine may have none).
#[cfg(test)]
pub(crate) fn hugetlb_memfd(len: u64) -> Result<File> {
    memfd(
        c"orbitkv-hugetlb",
        libc::MFD_ALLOW_SEALING | libc::MFD_HUGETLB,
        len,
        libc::F_SEAL_SHRINK | libc::F_SEAL_GROW,
        "sizing the hugetlbfs memfd",
    )
}

/// The engine's side: the pool it owns in shared memory.
pub struct HostPool {
    layout: Layout,
    states: FencedStates,
    fd: OwnedFd,
}

impl HostPool {
    /// Creates a pool for `spec` in a new memfd, sealed against shrinking and growing (so a
    /// mapping of it can never fault past its end), every page at generation 0.
    pub fn create(spec: PoolSpec) -> Result<Self> {
        Self::create_region(spec, true)
    }

    /// Creates the shared state words of a pool whose pages are device memory (registered with
    /// [`crate::PageMemory::Device`]): the same region without the pages, so the engine and
    /// the manager fence device pages exactly as host ones. [`HostPool::write`] and
    /// [`HostPool::read`] refuse: there are no page bytes here.
    pub fn create_states(spec: PoolSpec) -> Result<Self> {
        Self::create_region(spec, false)
    }

    fn create_region(spec: PoolSpec, holds_pages: bool) -> Result<Self> {
        spec.validate()?;
        let layout = Layout::of(&spec, holds_pages)?;
        let fd = OwnedFd::from(memfd(
            c"orbitkv-pool",
            libc::MFD_ALLOW_SEALING,
            layout.len,
            libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL,
            "sizing the pool region",
        )?);
        let region = Region::map(fd.as_fd(), layout.len)?;
        region.write(0, &layout.header(&spec))?;
        Ok(Self {
            layout,
            states: FencedStates::new(spec, region),
            fd,
        })
    }

    /// The descriptor to pass to the manager.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// The pool's registration.
    pub fn spec(&self) -> &PoolSpec {
        self.states.spec()
    }

    /// A reference to page `index` at its current generation.
    pub fn page_ref(&self, index: u32) -> Result<PageRef> {
        self.states.page_ref(index)
    }

    /// Reallocates page `index` (refused while the manager holds a lease on it): its generation
    /// goes up, so every older reference to it is stale. Call it before writing the page's new
    /// contents. Returns the new reference.
    pub fn reuse(&self, index: u32) -> Result<PageRef> {
        self.states.reuse(index)
    }

    /// Reallocates page `index` even while leased. An engine does it after waiting past its
    /// timeout for a lease to end: a copy out still running is then discarded, though a copy in
    /// still running may land. Tests use it to play an engine that does not wait.
    pub fn reuse_ignoring_leases(&self, index: u32) -> Result<PageRef> {
        self.states.reuse_ignoring_leases(index)
    }

    /// Leases the manager holds on page `index` now.
    pub fn leases(&self, index: u32) -> Result<u32> {
        self.states.leases(index)
    }

    /// Offset of the page memory in the region (where page 0 starts).
    pub fn data_offset(&self) -> u64 {
        self.layout.data_offset
    }

    /// Writes a record's bytes of `group` (packed, layer 0 first) into page `index`'s runs,
    /// where the group's placement puts them: what the engine's kernels do.
    pub fn write_group(&self, index: u32, group: u32, bytes: &[u8]) -> Result<()> {
        let (g, base) = self.group_at(index, group, bytes.len())?;
        let run = g.run_bytes() as usize;
        for (at, chunk) in g.runs(index, g.all_layers()).zip(bytes.chunks_exact(run)) {
            self.states.region().write(base + at, chunk)?;
        }
        Ok(())
    }

    /// Reads page `index`'s bytes of `group` into `out`, packed as a record holds them.
    pub fn read_group(&self, index: u32, group: u32, out: &mut [u8]) -> Result<()> {
        let (g, base) = self.group_at(index, group, out.len())?;
        let run = g.run_bytes() as usize;
        for (at, chunk) in g.runs(index, g.all_layers()).zip(out.chunks_exact_mut(run)) {
            self.states.region().read(base + at, chunk)?;
        }
        Ok(())
    }

    /// `group`'s geometry and the page memory's offset in the region, once `len` is checked
    /// to be a whole page of the group.
    fn group_at(&self, index: u32, group: u32, len: usize) -> Result<(GroupGeometry, u64)> {
        let spec = self.spec();
        self.page_span(index, 0, 0)?;
        let g = *spec.group(group)?;
        let expected = g.bytes_for(&g.all_layers());
        if len as u64 != expected {
            return Err(Error::Length {
                expected,
                got: len as u64,
            });
        }
        Ok((g, self.layout.data_offset))
    }

    /// Writes `bytes` into the page memory's `index`-th window of one page size, at `offset`
    /// (page `index` itself where every group's pages lie one after another).
    pub fn write(&self, index: u32, offset: u64, bytes: &[u8]) -> Result<()> {
        let at = self.page_span(index, offset, bytes.len())?;
        self.states.region().write(at, bytes)
    }

    /// Reads the page memory's `index`-th window of one page size, at `offset`, into `out`.
    pub fn read(&self, index: u32, offset: u64, out: &mut [u8]) -> Result<()> {
        let at = self.page_span(index, offset, out.len())?;
        self.states.region().read(at, out)
    }

    /// The fenced state words (and, through them, the mapping): tests scribble on the region.
    #[cfg(test)]
    pub(super) fn states(&self) -> &FencedStates {
        &self.states
    }

    fn page_span(&self, index: u32, offset: u64, len: usize) -> Result<u64> {
        let spec = self.spec();
        spec.check_index(index)?;
        if !self.layout.holds_pages {
            return Err(Error::Region(format!(
                "pool {} keeps its pages in device memory; this region holds only their state words",
                spec.pool
            )));
        }
        if offset
            .checked_add(len as u64)
            .is_none_or(|e| e > spec.page_bytes)
        {
            return Err(Error::Length {
                expected: spec.page_bytes,
                got: offset.saturating_add(len as u64),
            });
        }
        Ok(self.layout.page_base(spec, index) + offset)
    }
}
