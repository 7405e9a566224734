//! The shared mapping of a pool region: every `unsafe` touch of its bytes lives here.
//! The mapping is reached only through bounds-checked raw copies and atomic word views.
//! [`map_registered`] maps a region another process passed, after checking it.
//! Nothing the other process writes into the region is trusted for memory safety.

use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::AtomicU64;

use super::layout::{HEADER_LEN, Layout};
use crate::error::{Error, Result, os_err};
use crate::pool::PoolSpec;

/// A shared mapping of a pool region, accessed only through raw copies and atomics.
pub(crate) struct Region {
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
    pub(crate) fn map(fd: BorrowedFd<'_>, len: u64) -> Result<Self> {
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
    pub(crate) fn word(&self, at: usize) -> Option<&AtomicU64> {
        if !at.is_multiple_of(8) || at.checked_add(8)? > self.len {
            return None;
        }
        // SAFETY: `at..at + 8` lies in the mapping (checked above), which is page-aligned, so
        // the word is 8-aligned; the mapping outlives the returned reference (tied to `self`);
        // every access to state words, from either process, is atomic.
        Some(unsafe { AtomicU64::from_ptr(self.ptr.as_ptr().add(at).cast::<u64>()) })
    }

    /// Copies `bytes` into the region at `at`, streaming past the cache when they are many (the
    /// other process or a later step reads them, not this thread).
    #[expect(unsafe_code, reason = "a raw copy into shared memory")]
    pub(crate) fn write(&self, at: u64, bytes: &[u8]) -> Result<()> {
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
    pub(crate) fn read(&self, at: u64, out: &mut [u8]) -> Result<()> {
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
    pub(crate) fn append(&self, at: u64, len: usize, out: &mut Vec<u8>) -> Result<()> {
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

/// The seals on `fd` (`F_GET_SEALS`); 0 for a descriptor that takes none.
#[expect(unsafe_code, reason = "fcntl has no safe wrapper")]
pub(crate) fn seals(fd: BorrowedFd<'_>) -> i32 {
    // SAFETY: fcntl on an open descriptor, with integer arguments only.
    unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) }.max(0)
}

/// Whether `fd` is memory: a file of tmpfs (a memfd, POSIX shared memory). Copies through any
/// other file could wait on a disk or on a file system the peer serves. hugetlbfs is not: a
/// hole punched in a file there (which no seal prevents) frees its huge page, and a mapping's
/// next touch faults the daemon (SIGBUS) once no free huge page is left.
#[expect(unsafe_code, reason = "fstatfs has no safe wrapper in std")]
pub(crate) fn is_memory(fd: BorrowedFd<'_>) -> bool {
    // SAFETY: an all-zero statfs is a valid value to be overwritten.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: fstatfs on an open descriptor, writing into a live statfs.
    if unsafe { libc::fstatfs(fd.as_raw_fd(), &mut st) } != 0 {
        return false;
    }
    st.f_type == libc::TMPFS_MAGIC
}

/// Maps a region an engine passed for `spec` after checking it: sealed against shrinking,
/// exactly the size the registration implies (with or without the pages), its header agreeing.
pub(crate) fn map_registered(
    fd: OwnedFd,
    spec: &PoolSpec,
    holds_pages: bool,
) -> Result<(Layout, Region)> {
    spec.validate()?;
    let layout = Layout::of(spec, holds_pages)?;
    if seals(fd.as_fd()) & libc::F_SEAL_SHRINK == 0 {
        return Err(Error::Region(
            "the region is not sealed against shrinking (a memfd with F_SEAL_SHRINK is required)"
                .into(),
        ));
    }
    if !is_memory(fd.as_fd()) {
        return Err(Error::Region(
            "the region is not a memfd of tmpfs (hugetlbfs is refused)".into(),
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
