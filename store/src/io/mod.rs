//! The store's I/O, behind a trait: every byte the store reads or writes, every sync, create,
//! rename and lock goes through [`Io`], so tests can inject failures and power loss
//! (`fault::FaultIo`, built with the `fault-io` feature only) and production picks the backend ([`default_for`]: [`uring::UringIo`],
//! io_uring with `O_DIRECT` for aligned requests where both are available, probed;
//! [`std_io::StdIo`]: the portable positioned `pread`/`pwrite`).

pub mod aligned;
#[cfg(any(test, feature = "fault-io"))]
pub mod fault;
pub mod madvise;
mod sparse;
pub mod std_io;
pub mod uring;

use std::any::Any;
use std::io;
use std::path::Path;
use std::sync::Arc;

use crate::framed::FrameBuf;

/// An open file: positioned reads and writes, sync, length.
pub trait IoFile: Send + Sync {
    /// Reads up to `buf.len()` bytes at `offset`; returns how many (0 at end of file).
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize>;
    /// Writes up to `buf.len()` bytes at `offset`; returns how many (a short write is possible).
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<usize>;
    /// Makes the file's data durable (fdatasync).
    fn sync(&self) -> io::Result<()>;
    /// Current size in bytes.
    fn size(&self) -> io::Result<u64>;
    /// Truncates or extends.
    fn set_len(&self, len: u64) -> io::Result<()>;
    /// Reserves disk blocks for the first `len` bytes without changing the file's size
    /// (`fallocate(FALLOC_FL_KEEP_SIZE)`): a full disk shows at segment creation rather than
    /// mid-append, and appends allocate nothing. Blocks reserved past the end are released by
    /// [`IoFile::set_len`]. Backends without it return `Unsupported`.
    fn preallocate(&self, _len: u64) -> io::Result<()> {
        Err(io::ErrorKind::Unsupported.into())
    }
    /// Frees the disk blocks under `offset..offset + len`, keeping the size
    /// (`fallocate(FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE)`): the range reads as zeros.
    /// Only whole file-system blocks are freed. Backends without it return `Unsupported`.
    fn punch_hole(&self, _offset: u64, _len: u64) -> io::Result<()> {
        Err(io::ErrorKind::Unsupported.into())
    }
    /// The file's holes before its end, in order (`lseek` with `SEEK_HOLE` and `SEEK_DATA`).
    /// Backends and file systems that cannot tell report none.
    fn holes(&self) -> io::Result<Vec<(u64, u64)>> {
        Ok(Vec::new())
    }

    /// Reads `buf` at `offset` (at least `min` bytes; the rest as far as the file goes) and
    /// hands the bytes to `each` in order, `chunk` bytes at a time. Backends with asynchronous
    /// I/O call `each` on a chunk as soon as it is in, while the next ones are still being read,
    /// so the caller's copy and checksum overlap the device's transfer; this default reads
    /// everything first. Returns the bytes read.
    fn read_chunked(
        &self,
        buf: &mut [u8],
        offset: u64,
        min: usize,
        chunk: usize,
        each: &mut dyn FnMut(&[u8]),
    ) -> io::Result<usize> {
        read_then_hand_over(self, buf, offset, min, chunk, each)
    }

    /// Starts writing all of `buf` at `offset`. Returns `true` when the write is already
    /// complete (this default: a synchronous [`IoFile::write_all_at`]); `false` when it is in
    /// flight — the backend holds `buf` until it completes, its outcome is reported by
    /// [`IoFile::complete_writes`], and until then the file may not show the bytes (the caller
    /// serves reads of them from `buf`). Writes in flight must not overlap.
    fn submit_write(&self, buf: &Arc<WriteBuf>, offset: u64) -> io::Result<bool> {
        self.write_buf_at(buf, 0, offset).map(|()| true)
    }

    /// Waits until at most `in_flight` writes started by [`IoFile::submit_write`] are still in
    /// flight; returns the offsets of those that completed during the call. On a failed write it
    /// waits for every write in flight, then returns the first failure: from then on nothing
    /// submitted since the last good [`IoFile::sync`] is known to be written.
    fn complete_writes(&self, _in_flight: usize) -> io::Result<Vec<u64>> {
        Ok(Vec::new())
    }

    /// Reads exactly `buf.len()` bytes at `offset`, or fails with `UnexpectedEof`.
    fn read_exact_at(&self, mut buf: &mut [u8], mut offset: u64) -> io::Result<()> {
        while !buf.is_empty() {
            let n = self.read_at(buf, offset)?;
            if n == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "file ends early",
                ));
            }
            buf = &mut buf[n..];
            offset += n as u64;
        }
        Ok(())
    }

    /// Writes `buf`'s bytes from its byte `from` on at `offset + from`, part after part.
    fn write_buf_at(&self, buf: &WriteBuf, from: usize, offset: u64) -> io::Result<()> {
        let mut at = 0usize;
        for part in buf.parts() {
            let skip = from.saturating_sub(at).min(part.len());
            if skip < part.len() {
                self.write_all_at(&part[skip..], offset + (at + skip) as u64)?;
            }
            at += part.len();
        }
        Ok(())
    }

    /// Writes all of `buf` at `offset`, retrying short writes.
    fn write_all_at(&self, mut buf: &[u8], mut offset: u64) -> io::Result<()> {
        while !buf.is_empty() {
            let n = self.write_at(buf, offset)?;
            if n == 0 {
                return Err(io::Error::new(io::ErrorKind::WriteZero, "write returned 0"));
            }
            buf = &buf[n..];
            offset += n as u64;
        }
        Ok(())
    }
}

/// Bytes handed to [`IoFile::submit_write`], shared between the writer, the backend (until the
/// write completes) and readers of the bytes in flight: one buffer whose bytes start after `pad`
/// bytes of alignment (see [`aligned::aligned_vec`]), or consecutive frames each in its own
/// buffer ([`FrameBuf`]), written as one vectored write.
#[derive(Debug, Default)]
pub struct WriteBuf {
    bytes: Vec<u8>,
    pad: usize,
    frames: Vec<Arc<FrameBuf>>,
}

impl WriteBuf {
    /// The bytes of `bytes` after `pad`.
    pub fn new(bytes: Vec<u8>, pad: usize) -> Self {
        let pad = pad.min(bytes.len());
        Self {
            bytes,
            pad,
            frames: Vec::new(),
        }
    }

    /// The frames of `frames`, one after another.
    pub(crate) fn frames(frames: Vec<Arc<FrameBuf>>) -> Self {
        Self {
            frames,
            ..Self::default()
        }
    }

    /// The bytes to write, in order: one slice, or one per frame.
    pub fn parts(&self) -> impl Iterator<Item = &[u8]> {
        let one = self.frames.is_empty().then(|| &self.bytes[self.pad..]);
        one.into_iter().chain(self.frames.iter().map(|f| f.frame()))
    }

    /// Bytes to write.
    pub fn len(&self) -> usize {
        self.parts().map(<[u8]>::len).sum()
    }

    /// Whether there is nothing to write.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The `len` bytes from byte `at` on, when one part holds them all.
    pub fn slice(&self, at: usize, len: usize) -> Option<&[u8]> {
        let mut start = 0usize;
        for part in self.parts() {
            if let Some(within) = at.checked_sub(start)
                && within < part.len()
            {
                return part.get(within..within.checked_add(len)?);
            }
            start += part.len();
        }
        None
    }

    /// The one buffer and its pad, for reuse (empty for frames).
    pub fn into_parts(self) -> (Vec<u8>, usize) {
        (self.bytes, self.pad)
    }

    /// Whether it holds frames (not one buffer).
    pub(crate) fn is_frames(&self) -> bool {
        !self.frames.is_empty()
    }

    /// The frames, for reuse by whoever holds them last.
    pub(crate) fn into_frames(self) -> Vec<Arc<FrameBuf>> {
        self.frames
    }
}

/// Reads into `buf` at `offset` until at least `min` bytes are in (the rest, up to the buffer's
/// length, when the file has them); returns how many. A frame read as whole blocks may end past
/// the file's end.
pub fn read_at_least<F: IoFile + ?Sized>(
    file: &F,
    buf: &mut [u8],
    min: usize,
    offset: u64,
) -> io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        let n = file.read_at(&mut buf[got..], offset + got as u64)?;
        if n == 0 {
            break;
        }
        got += n;
    }
    if got < min {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "file ends early",
        ));
    }
    Ok(got)
}

/// The backend for a store in `data_dir`, probed: [`uring::UringIo`] with `O_DIRECT` when the
/// file system under the directory (or its nearest existing ancestor; nothing is created but a
/// probe file, removed) takes it, else [`uring::UringIo::buffered`] when the kernel gives an
/// io_uring, else the portable [`std_io::StdIo`]. Returns the backend and whether it is direct
/// (new segments should then be written with 4 KiB-aligned frames).
pub fn default_for(data_dir: &Path) -> (Arc<dyn Io>, bool) {
    let existing = data_dir.ancestors().find(|p| p.is_dir());
    let probed = match existing {
        Some(dir) => uring::UringIo::probe_in(dir),
        None => Err(io::Error::new(
            io::ErrorKind::NotFound,
            "no existing directory",
        )),
    };
    match probed {
        Ok(d) => {
            // Synchronous fallbacks inside when io_uring itself is refused.
            let _ = uring::available();
            (Arc::new(d), true)
        }
        Err(e) => {
            tracing::info!(
                "O_DIRECT is not available under {}: {e}; using buffered I/O",
                data_dir.display()
            );
            (offline_backend(), false)
        }
    }
}

/// The backend for the offline tools (`fsck` must not create anything in a data directory,
/// not even a probe file): [`uring::UringIo::buffered`] when the kernel gives an io_uring, else
/// [`std_io::StdIo`].
pub fn offline_backend() -> Arc<dyn Io> {
    if uring::available() {
        Arc::new(uring::UringIo::buffered())
    } else {
        Arc::new(std_io::StdIo)
    }
}

/// [`IoFile::read_chunked`] without overlap: reads everything, then hands it over in chunks.
pub fn read_then_hand_over<F: IoFile + ?Sized>(
    file: &F,
    buf: &mut [u8],
    offset: u64,
    min: usize,
    chunk: usize,
    each: &mut dyn FnMut(&[u8]),
) -> io::Result<usize> {
    let got = read_at_least(file, buf, min, offset)?;
    for c in buf[..got].chunks(chunk.max(1)) {
        each(c);
    }
    Ok(got)
}

/// Options opening a file in `mode`.
pub(crate) fn open_options(mode: OpenMode) -> std::fs::OpenOptions {
    let mut o = std::fs::OpenOptions::new();
    match mode {
        OpenMode::Read => o.read(true),
        OpenMode::ReadWrite => o.read(true).write(true),
        OpenMode::CreateNew => o.read(true).write(true).create_new(true),
    };
    o
}

/// How to open a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpenMode {
    /// Read only; the file must exist.
    Read,
    /// Read and write; the file must exist.
    ReadWrite,
    /// Read and write; created empty, failing if it exists.
    CreateNew,
}

/// A file system.
pub trait Io: Send + Sync {
    /// Opens `path`.
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Arc<dyn IoFile>>;
    /// Creates `path` and its parents.
    fn create_dir_all(&self, path: &Path) -> io::Result<()>;
    /// Names in directory `path` (files only, sorted).
    fn list_dir(&self, path: &Path) -> io::Result<Vec<String>>;
    /// Whether `path` exists.
    fn exists(&self, path: &Path) -> bool;
    /// Removes file `path`.
    fn remove_file(&self, path: &Path) -> io::Result<()>;
    /// Renames `from` to `to` (replacing `to`).
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    /// Makes directory `path`'s entries durable (creations, renames, removals).
    fn sync_dir(&self, path: &Path) -> io::Result<()>;
    /// Takes an exclusive lock on `path` (created if missing) for as long as the returned guard
    /// lives; `WouldBlock` when someone else holds it.
    fn lock_exclusive(&self, path: &Path) -> io::Result<Box<dyn Any + Send + Sync>>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_backend_is_probed_without_creating_the_data_directory() {
        let root = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let dir = root.path().join("not/yet");
        let (io, direct) = default_for(&dir);
        assert!(!dir.exists(), "probing created the data directory");
        // Whichever backend was chosen works on this file system.
        io.create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
        let f = io
            .open(&dir.join("f"), OpenMode::CreateNew)
            .unwrap_or_else(|e| panic!("{e}"));
        f.write_all_at(b"bytes", 0)
            .unwrap_or_else(|e| panic!("{e}"));
        let mut b = [0u8; 5];
        f.read_exact_at(&mut b, 0).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(&b, b"bytes");
        // And the probe agrees with a direct probe of the same place.
        assert_eq!(direct, uring::UringIo::probe_in(root.path()).is_ok());
    }
}
