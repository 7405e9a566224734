//! A pool's pages in memory the engine allocated itself (SGLang's `allocator: shm`): a
//! descriptor the engine owns, of tmpfs, with no header, the pages from an offset. The state words live
//! apart, in a states-only region. A descriptor sealed against shrinking is mapped; one that is
//! not is copied with `pread`/`pwrite`, so the engine shrinking it makes copies fail rather than
//! fault the daemon. This file holds no `unsafe`.

#![forbid(unsafe_code)]

use std::fs::File;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::region::{Region, is_memory, seals};
use crate::error::{Error, Result};

/// Descriptors of engine memory kept open in this process (pools copied through them).
static KEPT: AtomicUsize = AtomicUsize::new(0);

/// Descriptors of engine memory this process keeps open now: one per pool whose memory is not
/// sealed against shrinking (copied through its descriptor). A daemon bounds them, so that
/// peers cannot take every descriptor it may open.
pub fn kept_descriptors() -> usize {
    KEPT.load(Ordering::Acquire)
}

/// One kept descriptor, counted in [`kept_descriptors`] while it lives.
pub(crate) struct Kept(());

impl Kept {
    fn new() -> Self {
        KEPT.fetch_add(1, Ordering::AcqRel);
        Kept(())
    }
}

impl Drop for Kept {
    fn drop(&mut self) {
        KEPT.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The page memory of a pool the engine allocated.
pub(crate) enum EngineMemory {
    /// Sealed against shrinking: mapped up to the end of the page memory.
    Mapped {
        /// The mapping, from the descriptor's first byte.
        region: Region,
        /// Offset of the page memory in it.
        base: u64,
    },
    /// Not sealed: copied through the descriptor.
    File {
        /// The descriptor.
        file: File,
        /// Its place in the count of kept descriptors.
        _kept: Kept,
        /// Offset of the page memory in it.
        base: u64,
        /// Bytes of page memory.
        len: u64,
    },
}

fn io(what: &'static str) -> impl FnOnce(std::io::Error) -> Error {
    move |source| Error::Io { what, source }
}

impl EngineMemory {
    /// The `len` bytes of page memory at `offset` in `fd`, which must hold them now.
    pub(crate) fn open(fd: OwnedFd, offset: u64, len: u64) -> Result<Self> {
        let file = File::from(fd);
        if !is_memory(file.as_fd()) {
            return Err(Error::Region(
                "the engine memory is not memory: a memfd or shared memory file of tmpfs is needed (hugetlbfs is refused)"
                    .to_owned(),
            ));
        }
        let size = file
            .metadata()
            .map_err(io("reading the engine memory's size"))?
            .len();
        let end = offset
            .checked_add(len)
            .filter(|end| *end <= size)
            .ok_or_else(|| {
                Error::Region(format!(
                    "the engine memory holds {size} bytes; the pool's pages need {len} from offset {offset}"
                ))
            })?;
        if seals(file.as_fd()) & libc::F_SEAL_SHRINK != 0 {
            let region = Region::map(file.as_fd(), end)?;
            return Ok(EngineMemory::Mapped {
                region,
                base: offset,
            });
        }
        Ok(EngineMemory::File {
            file,
            _kept: Kept::new(),
            base: offset,
            len,
        })
    }

    /// Whether copies go through the descriptor rather than a mapping.
    pub(crate) fn copies_through_file(&self) -> bool {
        matches!(self, EngineMemory::File { .. })
    }

    /// Copies `bytes` into the page memory at `at`.
    pub(crate) fn write(&self, at: u64, bytes: &[u8]) -> Result<()> {
        match self {
            EngineMemory::Mapped { region, base } => region.write(base + at, bytes),
            EngineMemory::File {
                file, base, len, ..
            } => {
                let end = checked(at, bytes.len(), *len)?;
                // A descriptor shrunk under the pool must not grow back by this write.
                let size = file
                    .metadata()
                    .map_err(io("reading the engine memory's size"))?
                    .len();
                if base + end > size {
                    return Err(shrunk(base + end));
                }
                file.write_all_at(bytes, base + at)
                    .map_err(io("writing the engine memory"))
            }
        }
    }

    /// Appends `n` bytes of the page memory at `at` to `out`.
    pub(crate) fn append(&self, at: u64, n: usize, out: &mut Vec<u8>) -> Result<()> {
        match self {
            EngineMemory::Mapped { region, base } => region.append(base + at, n, out),
            EngineMemory::File {
                file, base, len, ..
            } => {
                checked(at, n, *len)?;
                let old = out.len();
                out.resize(old + n, 0);
                let r = file.read_exact_at(&mut out[old..], base + at);
                if r.is_err() {
                    out.truncate(old);
                }
                r.map_err(|e| match e.kind() {
                    std::io::ErrorKind::UnexpectedEof => shrunk(base + at + n as u64),
                    _ => Error::Io {
                        what: "reading the engine memory",
                        source: e,
                    },
                })
            }
        }
    }
}

/// The end of `n` bytes at `at`, checked to lie in `len` bytes of page memory.
fn checked(at: u64, n: usize, len: u64) -> Result<u64> {
    at.checked_add(n as u64)
        .filter(|end| *end <= len)
        .ok_or_else(|| Error::Region(format!("{n} bytes at {at} lie outside the page memory")))
}

fn shrunk(need: u64) -> Error {
    Error::Region(format!(
        "the engine memory shrank below byte {need}: the page is not copied"
    ))
}
