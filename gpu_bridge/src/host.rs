//! The host backend: an engine's page pool in shared memory the engine process owns. The engine
//! creates the pool ([`HostPool::create`]: a sealed memfd, so its size can never change under
//! the manager) and passes its descriptor over the control socket ([`crate::fdpass`]); the
//! manager maps it ([`AttachedPool::attach`]) after checking the region against the
//! registration. Both sides see the per-page state words (generation and leases), so the copies
//! really cross processes and the fencing is the one the CUDA backend uses. The region's layout
//! is in `docs/protocol.md` ("Host page pool").
//!
//! Nothing the other process writes into the region is trusted for memory safety: every offset
//! comes from the registration validated at attach time, never from bytes in the region.

use std::fs::File;
use std::ops::Range;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering, fence};
use std::sync::{Arc, RwLock};

use crate::backend::{PageLease, PagePool};
use crate::error::{Error, Result, os_err};
use crate::pool::{PageRef, PageState, PoolSpec, check_generation, generation_of, leases_of};

/// The region's first bytes.
pub const REGION_MAGIC: [u8; 8] = *b"OKVPOOL\0";
/// The region layout's version.
pub const REGION_VERSION: u32 = 1;
/// Bytes of the region header.
pub const HEADER_LEN: usize = 64;
/// Page data starts on a boundary of this many bytes.
pub const DATA_ALIGN: u64 = 4096;

/// Where things lie in a pool's region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Layout {
    /// Offset of page 0 (for a states-only region, its end).
    data_offset: u64,
    /// Length of the whole region.
    len: u64,
    /// Whether the pages follow the state words (a host pool) or live elsewhere, in device
    /// memory (the region holds a device pool's state words only).
    holds_pages: bool,
}

impl Layout {
    fn of(spec: &PoolSpec, holds_pages: bool) -> Result<Self> {
        let words = HEADER_LEN as u64 + 8 * u64::from(spec.pages);
        let data_offset = words.next_multiple_of(DATA_ALIGN);
        let pages = if holds_pages { spec.pages } else { 0 };
        let len = u64::from(pages)
            .checked_mul(spec.page_bytes)
            .and_then(|x| x.checked_add(data_offset))
            .filter(|l| usize::try_from(*l).is_ok() && *l <= isize::MAX as u64)
            .ok_or_else(|| {
                Error::Geometry("the pool is larger than this machine addresses".into())
            })?;
        Ok(Self {
            data_offset,
            len,
            holds_pages,
        })
    }

    fn header(&self, spec: &PoolSpec) -> [u8; HEADER_LEN] {
        let mut h = [0u8; HEADER_LEN];
        h[0..8].copy_from_slice(&REGION_MAGIC);
        h[8..12].copy_from_slice(&REGION_VERSION.to_le_bytes());
        h[12..16].copy_from_slice(&spec.pool.0.to_le_bytes());
        h[16..24].copy_from_slice(&spec.page_bytes.to_le_bytes());
        h[24..28].copy_from_slice(&spec.pages.to_le_bytes());
        h[28..32].copy_from_slice(&u32::from(!self.holds_pages).to_le_bytes());
        h[32..40].copy_from_slice(&self.data_offset.to_le_bytes());
        h
    }

    /// Checks a region's header against the registration.
    fn check_header(&self, spec: &PoolSpec, h: &[u8; HEADER_LEN]) -> Result<()> {
        let want = self.header(spec);
        if h[0..8] != REGION_MAGIC {
            return Err(Error::Region("not a pool region (bad magic)".into()));
        }
        if h[8..12] != want[8..12] {
            return Err(Error::Region(format!(
                "region layout version {}, this build reads {REGION_VERSION}",
                u32::from_le_bytes([h[8], h[9], h[10], h[11]])
            )));
        }
        if h[28..32] != want[28..32] {
            return Err(Error::Region(if self.holds_pages {
                "the region holds only page state words (a device pool's), not the pages of a host pool".into()
            } else {
                "the region holds a host pool's pages, not a device pool's state words".into()
            }));
        }
        if h[12..40] != want[12..40] {
            return Err(Error::Region(
                "the region's pool id, page size, page count or data offset differ from the registration"
                    .into(),
            ));
        }
        Ok(())
    }
}

/// A shared mapping of a pool region, accessed only through raw copies and atomics.
struct Region {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain shared memory owned by this value until it is dropped; every
// access goes through bounds-checked raw copies or atomics, which are sound from any thread.
#[expect(unsafe_code, reason = "a shared mapping is accessed from any thread")]
unsafe impl Send for Region {}
// SAFETY: as above; no `&`/`&mut` to the bytes is ever handed out.
#[expect(unsafe_code, reason = "a shared mapping is accessed from any thread")]
unsafe impl Sync for Region {}

impl Region {
    #[expect(unsafe_code, reason = "mmap of a shared pool region")]
    fn map(fd: BorrowedFd<'_>, len: u64) -> Result<Self> {
        let len = usize::try_from(len).map_err(|_| Error::Region("region too large".into()))?;
        // SAFETY: a fresh mapping (null hint) of `len` bytes of an open descriptor; the kernel
        // picks the address, so no existing memory is affected.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(os_err("mmap of the pool region"));
        }
        let ptr = NonNull::new(p.cast::<u8>()).ok_or_else(|| os_err("mmap returned null"))?;
        Ok(Self { ptr, len })
    }

    /// The state word at byte `at` (8-aligned, inside the region).
    #[expect(unsafe_code, reason = "an atomic view of a word in shared memory")]
    fn word(&self, at: usize) -> Option<&AtomicU64> {
        if !at.is_multiple_of(8) || at.checked_add(8)? > self.len {
            return None;
        }
        // SAFETY: `at..at + 8` lies in the mapping (checked above), which is page-aligned, so
        // the word is 8-aligned; the mapping outlives the returned reference (tied to `self`);
        // every access to state words, from either process, is atomic.
        Some(unsafe { AtomicU64::from_ptr(self.ptr.as_ptr().add(at).cast::<u64>()) })
    }

    /// The state word of page `index` of `spec`'s pool.
    fn state(&self, spec: &PoolSpec, index: u32) -> Result<PageState<'_>> {
        spec.check_index(index)?;
        self.word(word_at(index))
            .map(PageState)
            .ok_or_else(|| Error::Region("state word outside the region".into()))
    }

    /// Copies `bytes` into the region at `at`, streaming past the cache when they are many (the
    /// other process or a later step reads them, not this thread).
    #[expect(unsafe_code, reason = "a raw copy into shared memory")]
    fn write(&self, at: u64, bytes: &[u8]) -> Result<()> {
        let at = self.check(at, bytes.len())?;
        // SAFETY: `at..at + len` lies in the mapping (checked); the source is a separate Rust
        // slice, so the ranges do not overlap. The other process may touch the same bytes
        // concurrently: the copy is raw (no reference to the region exists), and the fencing
        // protocol decides whether what was copied is used.
        unsafe {
            crate::nontemporal::copy(bytes.as_ptr(), self.ptr.as_ptr().add(at), bytes.len());
        }
        Ok(())
    }

    /// Copies from the region at `at` into `out`.
    #[expect(unsafe_code, reason = "a raw copy out of shared memory")]
    fn read(&self, at: u64, out: &mut [u8]) -> Result<()> {
        let at = self.check(at, out.len())?;
        // SAFETY: as in `write`, with the roles of source and destination swapped.
        unsafe {
            std::ptr::copy_nonoverlapping(self.ptr.as_ptr().add(at), out.as_mut_ptr(), out.len());
        }
        Ok(())
    }

    /// Appends `len` bytes of the region at `at` to `out`, copied straight into its spare
    /// capacity (no zero-fill pass first: a copy out costs one pass over the bytes).
    #[expect(
        unsafe_code,
        reason = "a raw copy out of shared memory into a Vec's spare capacity"
    )]
    fn append(&self, at: u64, len: usize, out: &mut Vec<u8>) -> Result<()> {
        let at = self.check(at, len)?;
        out.reserve(len);
        let old = out.len();
        // SAFETY: `at..at + len` lies in the mapping (checked) and `reserve` made room for `len`
        // more bytes after `old`; the ranges do not overlap (the Vec is a separate allocation).
        // The `len` bytes are initialized by the copy before `set_len` exposes them. The copy
        // streams past the cache: the store reads `out` later, not now.
        unsafe {
            crate::nontemporal::copy(self.ptr.as_ptr().add(at), out.as_mut_ptr().add(old), len);
            out.set_len(old + len);
        }
        Ok(())
    }

    fn check(&self, at: u64, len: usize) -> Result<usize> {
        usize::try_from(at)
            .ok()
            .filter(|a| a.checked_add(len).is_some_and(|end| end <= self.len))
            .ok_or_else(|| Error::Region(format!("{len} bytes at {at} lie outside the region")))
    }
}

impl Drop for Region {
    #[expect(unsafe_code, reason = "munmap of the mapping this value owns")]
    fn drop(&mut self) {
        // SAFETY: the mapping was made by `Region::map` with this length and is not used after
        // this (no reference into it outlives `self`).
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast(), self.len);
        }
    }
}

/// Byte offset of page `index`'s state word.
fn word_at(index: u32) -> usize {
    HEADER_LEN + 8 * index as usize
}

/// The engine's side: the pool it owns in shared memory.
pub struct HostPool {
    spec: PoolSpec,
    layout: Layout,
    region: Region,
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

    #[expect(unsafe_code, reason = "memfd_create and fcntl have no safe wrapper")]
    fn create_region(spec: PoolSpec, holds_pages: bool) -> Result<Self> {
        spec.validate()?;
        let layout = Layout::of(&spec, holds_pages)?;
        // SAFETY: memfd_create reads the NUL-terminated name and returns a new descriptor.
        let raw = unsafe {
            libc::memfd_create(
                c"orbitkv-pool".as_ptr(),
                libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
            )
        };
        if raw < 0 {
            return Err(os_err("memfd_create"));
        }
        // SAFETY: `raw` is a descriptor just returned to us and owned by nothing else.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let file = File::from(fd);
        file.set_len(layout.len).map_err(|source| Error::Io {
            what: "sizing the pool region",
            source,
        })?;
        let fd = OwnedFd::from(file);
        let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
        // SAFETY: fcntl on a descriptor we own, with integer arguments only.
        if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) } != 0 {
            return Err(os_err("sealing the pool region"));
        }
        let region = Region::map(fd.as_fd(), layout.len)?;
        region.write(0, &layout.header(&spec))?;
        Ok(Self {
            spec,
            layout,
            region,
            fd,
        })
    }

    /// The descriptor to pass to the manager.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// The pool's registration.
    pub fn spec(&self) -> &PoolSpec {
        &self.spec
    }

    /// A reference to page `index` at its current generation.
    pub fn page_ref(&self, index: u32) -> Result<PageRef> {
        Ok(PageRef {
            pool: self.spec.pool,
            index,
            generation: generation_of(self.region.state(&self.spec, index)?.load()),
        })
    }

    /// Reallocates page `index` (refused while the manager holds a lease on it): its generation
    /// goes up, so every older reference to it is stale. Call it before writing the page's new
    /// contents. Returns the new reference.
    pub fn reuse(&self, index: u32) -> Result<PageRef> {
        let generation = self
            .region
            .state(&self.spec, index)?
            .reuse(self.spec.pool, index)?;
        Ok(PageRef {
            pool: self.spec.pool,
            index,
            generation,
        })
    }

    /// Reallocates page `index` even while leased: what a misbehaving engine does (tests).
    pub fn reuse_ignoring_leases(&self, index: u32) -> Result<PageRef> {
        let generation = self
            .region
            .state(&self.spec, index)?
            .reuse_ignoring_leases();
        Ok(PageRef {
            pool: self.spec.pool,
            index,
            generation,
        })
    }

    /// Leases the manager holds on page `index` now.
    pub fn leases(&self, index: u32) -> Result<u32> {
        Ok(leases_of(self.region.state(&self.spec, index)?.load()))
    }

    /// Writes `bytes` into page `index` at `offset`.
    pub fn write(&self, index: u32, offset: u64, bytes: &[u8]) -> Result<()> {
        let at = self.page_span(index, offset, bytes.len())?;
        self.region.write(at, bytes)
    }

    /// Reads page `index` at `offset` into `out`.
    pub fn read(&self, index: u32, offset: u64, out: &mut [u8]) -> Result<()> {
        let at = self.page_span(index, offset, out.len())?;
        self.region.read(at, out)
    }

    fn page_span(&self, index: u32, offset: u64, len: usize) -> Result<u64> {
        self.spec.check_index(index)?;
        if !self.layout.holds_pages {
            return Err(Error::Region(format!(
                "pool {} keeps its pages in device memory; this region holds only their state words",
                self.spec.pool
            )));
        }
        if offset
            .checked_add(len as u64)
            .is_none_or(|e| e > self.spec.page_bytes)
        {
            return Err(Error::Length {
                expected: self.spec.page_bytes,
                got: offset.saturating_add(len as u64),
            });
        }
        Ok(self.layout.data_offset + u64::from(index) * self.spec.page_bytes + offset)
    }
}

/// Maps a region an engine passed for `spec` after checking it: sealed against shrinking,
/// exactly the size the registration implies (with or without the pages), its header agreeing.
#[expect(unsafe_code, reason = "fcntl has no safe wrapper")]
fn map_registered(fd: OwnedFd, spec: &PoolSpec, holds_pages: bool) -> Result<(Layout, Region)> {
    spec.validate()?;
    let layout = Layout::of(spec, holds_pages)?;
    // SAFETY: fcntl on a descriptor we own, with integer arguments only.
    let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
    if seals < 0 || seals & libc::F_SEAL_SHRINK == 0 {
        return Err(Error::Region(
            "the region is not sealed against shrinking (a memfd with F_SEAL_SHRINK is required)"
                .into(),
        ));
    }
    let file = File::from(fd);
    let size = file
        .metadata()
        .map_err(|source| Error::Io {
            what: "reading the pool region's size",
            source,
        })?
        .len();
    if size != layout.len {
        return Err(Error::Region(format!(
            "the region holds {size} bytes; the registration implies {}",
            layout.len
        )));
    }
    let region = Region::map(file.as_fd(), layout.len)?;
    let mut h = [0u8; HEADER_LEN];
    region.read(0, &mut h)?;
    layout.check_header(spec, &h)?;
    Ok((layout, region))
}

/// The manager's side of a device pool's page state words: the states-only region the engine
/// created ([`HostPool::create_states`]) and passed, mapped and checked like a host pool's. The
/// pages themselves are device memory, copied by the device backend.
pub struct SharedStates {
    spec: PoolSpec,
    region: Region,
}

impl SharedStates {
    /// Maps the states-only region `fd` refers to, registered as `spec`.
    pub fn attach(fd: OwnedFd, spec: &PoolSpec) -> Result<Self> {
        let (_, region) = map_registered(fd, spec, false)?;
        Ok(Self {
            spec: spec.clone(),
            region,
        })
    }

    /// Page `index`'s state word.
    pub fn state(&self, index: u32) -> Result<PageState<'_>> {
        self.region.state(&self.spec, index)
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
}

impl std::fmt::Debug for SharedStates {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedStates")
            .field("pool", &self.spec.pool)
            .field("pages", &self.spec.pages)
            .finish()
    }
}

/// The manager's side: an engine's pool mapped from the descriptor it passed.
pub struct AttachedPool {
    spec: PoolSpec,
    epoch: u64,
    layout: Layout,
    region: Region,
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
            spec,
            epoch,
            layout,
            region,
            detached: RwLock::new(false),
        }))
    }

    fn page_base(&self, index: u32) -> u64 {
        self.layout.data_offset + u64::from(index) * self.spec.page_bytes
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
        if !same_pool || page.pool != self.spec.pool {
            return Err(Error::UnknownPool { pool: page.pool });
        }
        let word = self.region.state(&self.spec, page.index)?.load();
        check_generation(word, page)?;
        Ok(word)
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
            self.region.state(&self.spec, page.index)?.lease(page)
        })
    }

    fn release(&self, index: u32) {
        if let Ok(s) = self.region.state(&self.spec, index) {
            s.release();
        }
    }

    fn generation(&self, index: u32) -> Result<u64> {
        Ok(generation_of(self.region.state(&self.spec, index)?.load()))
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
            if layers.start > layers.end || layers.end > g.layers {
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
            let base = self.page_base(lease.page().index);
            let lb = g.layer_bytes as usize;
            for (l, chunk) in layers.clone().zip(bytes.chunks_exact(lb)) {
                self.region.write(base + g.layer_range(l).start, chunk)?;
            }
            Ok(())
        })
    }

    fn copy_out(&self, lease: &PageLease, group: u32, out: &mut Vec<u8>) -> Result<()> {
        out.clear();
        let r = self.attached(|| {
            let before = generation_of(self.check_lease(lease)?);
            let g = self.spec.group(group)?;
            let total = usize::try_from(g.bytes_for(&g.all_layers()))
                .map_err(|_| Error::Geometry("group too large".into()))?;
            out.reserve(total);
            let base = self.page_base(lease.page().index);
            let lb = g.layer_bytes as usize;
            for l in g.all_layers() {
                self.region.append(base + g.layer_range(l).start, lb, out)?;
            }
            // Seqlock-style: the copy's reads happen before the generation is read again.
            fence(Ordering::Acquire);
            let after = generation_of(self.region.state(&self.spec, lease.page().index)?.load());
            if after != before {
                return Err(Error::ChangedDuringCopy {
                    pool: self.spec.pool,
                    index: lease.page().index,
                    before,
                    after,
                });
            }
            Ok(())
        });
        if r.is_err() {
            out.clear();
        }
        r
    }

    fn detach(&self) {
        *self.detached.write().unwrap_or_else(|e| e.into_inner()) = true;
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsFd;
    use std::sync::atomic::AtomicBool;

    use super::*;
    use crate::pool::{GroupGeometry, PoolId};

    fn spec(page_bytes: u64, pages: u32) -> PoolSpec {
        PoolSpec {
            pool: PoolId(2),
            page_bytes,
            pages,
            groups: vec![GroupGeometry {
                group: 0,
                layers: 4,
                offset: 0,
                layer_stride: page_bytes / 4,
                layer_bytes: page_bytes / 4,
            }],
        }
    }

    fn attach(pool: &HostPool, spec: PoolSpec) -> Result<Arc<AttachedPool>> {
        let fd = pool.fd().try_clone_to_owned().map_err(|source| Error::Io {
            what: "dup",
            source,
        })?;
        AttachedPool::attach(fd, spec, 1)
    }

    #[test]
    fn a_device_pools_state_words_are_shared_and_fence_alike() -> Result<()> {
        let engine = HostPool::create_states(spec(1 << 20, 64))?;
        let dup = || {
            engine
                .fd()
                .try_clone_to_owned()
                .map_err(|source| Error::Io {
                    what: "dup",
                    source,
                })
        };
        let manager = SharedStates::attach(dup()?, &spec(1 << 20, 64))?;
        // The region holds the words only: 64 MiB of pages are not in it.
        let size = File::from(dup()?)
            .metadata()
            .map_err(|source| Error::Io {
                what: "stat",
                source,
            })?
            .len();
        assert_eq!(size, DATA_ALIGN);
        // The engine reuses page 3; the manager sees the new generation and leases it there.
        let p = engine.reuse(3)?;
        assert_eq!(generation_of(manager.state(3)?.load()), p.generation);
        manager.state(3)?.lease(p)?;
        assert!(matches!(engine.reuse(3), Err(Error::PageLeased { .. })));
        assert_eq!(engine.leases(3)?, 1);
        manager.state(3)?.release();
        let q = engine.reuse(3)?;
        assert!(matches!(
            manager.state(3)?.lease(p),
            Err(Error::StaleGeneration { .. })
        ));
        manager.state(3)?.lease(q)?;
        assert!(matches!(
            manager.state(64),
            Err(Error::IndexOutOfRange { .. })
        ));
        // No page bytes to write or read here.
        assert!(
            matches!(engine.write(0, 0, &[1; 8]), Err(Error::Region(m)) if m.contains("device memory"))
        );
        assert!(matches!(
            engine.read(0, 0, &mut [0; 8]),
            Err(Error::Region(_))
        ));
        // A states-only region is not a host pool, and a host pool's region is not one.
        assert!(matches!(
            AttachedPool::attach(dup()?, spec(1 << 20, 64), 1),
            Err(Error::Region(_))
        ));
        let host = HostPool::create(spec(4096, 8))?;
        let host_fd = host.fd().try_clone_to_owned().map_err(|source| Error::Io {
            what: "dup",
            source,
        })?;
        assert!(matches!(
            SharedStates::attach(host_fd, &spec(4096, 8)),
            Err(Error::Region(_))
        ));
        Ok(())
    }

    #[test]
    fn a_region_must_match_its_registration() -> Result<()> {
        let pool = HostPool::create(spec(4096, 8))?;
        assert!(attach(&pool, spec(4096, 8)).is_ok());
        // Another page count or size: the region's size or header disagrees.
        assert!(matches!(
            attach(&pool, spec(4096, 9)),
            Err(Error::Region(_))
        ));
        assert!(matches!(
            attach(&pool, spec(8192, 4)),
            Err(Error::Region(_))
        ));
        let mut other = spec(4096, 8);
        other.pool = PoolId(3);
        assert!(matches!(attach(&pool, other), Err(Error::Region(m)) if m.contains("pool id")));
        // Bad magic.
        pool.region.write(0, b"NOTAPOOL")?;
        assert!(
            matches!(attach(&pool, spec(4096, 8)), Err(Error::Region(m)) if m.contains("magic"))
        );
        Ok(())
    }

    #[test]
    fn an_unsealed_region_is_refused() -> Result<()> {
        let f = tempfile::tempfile().map_err(|source| Error::Io {
            what: "tmp",
            source,
        })?;
        let layout = Layout::of(&spec(4096, 8), true)?;
        f.set_len(layout.len).map_err(|source| Error::Io {
            what: "len",
            source,
        })?;
        let fd = f.as_fd().try_clone_to_owned().map_err(|source| Error::Io {
            what: "dup",
            source,
        })?;
        assert!(matches!(
            AttachedPool::attach(fd, spec(4096, 8), 1),
            Err(Error::Region(m)) if m.contains("sealed")
        ));
        Ok(())
    }

    #[test]
    fn no_copy_out_of_a_page_reused_mid_copy_is_kept() -> Result<()> {
        // 4 MiB pages, so copies take long enough to overlap the engine's reuses.
        let page_bytes = 4u64 << 20;
        let engine = Arc::new(HostPool::create(spec(page_bytes, 1))?);
        let manager = attach(&engine, spec(page_bytes, 1))?;
        let fill = move |g: u64| vec![(g % 251) as u8 + 1; page_bytes as usize];
        engine.write(0, 0, &fill(0))?;
        // The generation whose bytes are completely written.
        let ready = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let churn = {
            let (engine, ready, stop) = (engine.clone(), ready.clone(), stop.clone());
            std::thread::spawn(move || -> Result<()> {
                let mut k = 0u64;
                while !stop.load(Ordering::Acquire) {
                    // An engine that reallocates without asking: bump, then write; then the
                    // page stays put for a varying while (0 to 1.2 ms), so some copies finish
                    // and others overlap the next reuse.
                    let r = engine.reuse_ignoring_leases(0)?;
                    // Back to front, so the engine's writes cross the manager's front-to-back
                    // copy instead of trailing it.
                    let bytes = fill(r.generation);
                    for (i, chunk) in bytes.chunks(64 << 10).enumerate().rev() {
                        engine.write(0, (i as u64) << 16, chunk)?;
                    }
                    ready.store(r.generation, Ordering::Release);
                    k += 1;
                    std::thread::sleep(std::time::Duration::from_micros((k % 7) * 200));
                }
                Ok(())
            })
        };
        let (mut kept, mut discarded, mut stale) = (0, 0, 0);
        let pool: Arc<dyn PagePool> = manager.clone();
        let mut out = Vec::new();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while (kept < 20 || discarded + stale < 20) && std::time::Instant::now() < deadline {
            let page = PageRef {
                pool: PoolId(2),
                index: 0,
                generation: ready.load(Ordering::Acquire),
            };
            let lease = match PageLease::take(pool.clone(), page) {
                Ok(l) => l,
                Err(Error::StaleGeneration { .. }) => {
                    stale += 1;
                    continue;
                }
                Err(e) => return Err(e),
            };
            match manager.copy_out(&lease, 0, &mut out) {
                Ok(()) => {
                    kept += 1;
                    assert!(
                        out == fill(page.generation),
                        "a kept copy holds other bytes than generation {}",
                        page.generation
                    );
                }
                Err(Error::ChangedDuringCopy { .. }) => {
                    discarded += 1;
                    assert!(out.is_empty());
                }
                Err(Error::StaleGeneration { .. }) => stale += 1,
                Err(e) => return Err(e),
            }
        }
        stop.store(true, Ordering::Release);
        churn
            .join()
            .unwrap_or_else(|_| panic!("the engine thread panicked"))?;
        eprintln!("kept {kept}, discarded mid-copy {discarded}, stale before copying {stale}");
        assert!(kept > 0, "no copy ever finished between reuses");
        assert!(
            discarded + stale > 0,
            "the engine never reused the page during a copy"
        );
        Ok(())
    }
}
