//! The O_DIRECT backend: each file is open twice, once with `O_DIRECT` and once buffered. A read
//! or write whose buffer address, file offset and length are all multiples of [`DIRECT_ALIGN`]
//! goes through the direct descriptor (no page-cache copy; this machine's page cache caps
//! buffered writes at a third of what the device does); anything else (segment headers,
//! footers, the manifest, scans) goes through the buffered one. Linux keeps the two coherent:
//! a direct write invalidates the cached pages it covers, and a direct read first writes back
//! dirty cached pages in its range. Segments written with [`orbitkv_segments::Alignment::Direct`]
//! put every frame on a 4 KiB boundary with a 4 KiB-multiple length, so appends and verified
//! reads of whole frames are direct. Support is probed ([`DirectIo::probe`]) before use: some
//! file systems (tmpfs, some overlay mounts) refuse `O_DIRECT`.

use std::any::Any;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::sync::Arc;

use io_uring::{IoUring, opcode, types};

use super::std_io::StdIo;
use super::{Io, IoFile, OpenMode};

/// Alignment of buffer addresses, offsets and lengths for direct I/O.
pub const DIRECT_ALIGN: usize = 4096;

/// Real files with direct I/O for aligned requests.
#[derive(Debug, Default, Clone, Copy)]
pub struct DirectIo {
    dirs: StdIo,
}

#[derive(Debug)]
struct DirectFile {
    buffered: File,
    direct: File,
}

fn aligned(ptr: *const u8, len: usize, offset: u64) -> bool {
    len > 0
        && (ptr as usize).is_multiple_of(DIRECT_ALIGN)
        && len.is_multiple_of(DIRECT_ALIGN)
        && offset.is_multiple_of(DIRECT_ALIGN as u64)
}

/// An empty-looking buffer for up to `capacity` bytes appended after `pad` zero bytes, where
/// `pad` puts the appended bytes on a [`DIRECT_ALIGN`] boundary; returns it with `pad`. Safe
/// code: the vector is over-allocated, so appending up to `capacity` bytes never moves it (if
/// it does move, requests through it are merely not direct).
pub fn aligned_vec(capacity: usize) -> (Vec<u8>, usize) {
    let mut v = Vec::with_capacity(capacity + DIRECT_ALIGN);
    let pad = (DIRECT_ALIGN - (v.as_ptr() as usize) % DIRECT_ALIGN) % DIRECT_ALIGN;
    v.resize(pad, 0);
    (v, pad)
}

/// A zeroed buffer whose slice `[pad..pad + len]` starts on a [`DIRECT_ALIGN`] boundary;
/// returns it with `pad`.
pub fn aligned_buffer(len: usize) -> (Vec<u8>, usize) {
    let (mut v, pad) = aligned_vec(len);
    v.resize(pad + len, 0);
    (v, pad)
}

impl IoFile for DirectFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        if aligned(buf.as_ptr(), buf.len(), offset) {
            match self.direct.read_at(buf, offset) {
                // A device whose logical block is larger than 4 KiB refuses the request:
                // read it through the page cache instead.
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {}
                r => return r,
            }
        }
        self.buffered.read_at(buf, offset)
    }
    fn read_chunked(
        &self,
        buf: &mut [u8],
        offset: u64,
        min: usize,
        chunk: usize,
        each: &mut dyn FnMut(&[u8]),
    ) -> io::Result<usize> {
        let chunk = chunk.next_multiple_of(DIRECT_ALIGN);
        if aligned(buf.as_ptr(), buf.len(), offset) && buf.len() > chunk {
            let done = RING.with_borrow_mut(|ring| {
                let ring = ring.get_or_insert_with(|| {
                    IoUring::new(RING_DEPTH)
                        .inspect_err(|e| {
                            tracing::info!("io_uring unavailable, reading synchronously: {e}");
                        })
                        .ok()
                });
                ring.as_mut()
                    .map(|r| uring_read_chunked(r, &self.direct, buf, offset, min, chunk, each))
            });
            if let Some(r) = done {
                return r;
            }
        }
        super::read_then_hand_over(self, buf, offset, min, chunk, each)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<usize> {
        if aligned(buf.as_ptr(), buf.len(), offset) {
            self.direct.write_at(buf, offset)
        } else {
            self.buffered.write_at(buf, offset)
        }
    }
    fn sync(&self) -> io::Result<()> {
        // Direct writes skip the page cache, not the device cache or the inode (size).
        self.buffered.sync_data()
    }
    fn size(&self) -> io::Result<u64> {
        Ok(self.buffered.metadata()?.len())
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.buffered.set_len(len)
    }
    fn preallocate(&self, len: u64) -> io::Result<()> {
        fallocate_keep_size(&self.buffered, len)
    }
}

/// `fallocate(FALLOC_FL_KEEP_SIZE)` over `0..len`.
#[expect(unsafe_code, reason = "fallocate has no safe wrapper in std")]
pub(crate) fn fallocate_keep_size(f: &File, len: u64) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let len = libc::off_t::try_from(len).map_err(|_| io::Error::other("length too large"))?;
    // SAFETY: fallocate only reads its integer arguments; the descriptor is open (borrowed from
    // `f`) for the duration of the call.
    let r = unsafe { libc::fallocate(f.as_raw_fd(), libc::FALLOC_FL_KEEP_SIZE, 0, len) };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Reads in flight at once per reader thread.
const RING_DEPTH: u32 = 16;

thread_local! {
    /// Each reader thread's ring, made on first use (`None`: the kernel refused one).
    static RING: std::cell::RefCell<Option<Option<IoUring>>> =
        const { std::cell::RefCell::new(None) };
}

/// Reads `buf` (aligned) at `offset` as `chunk`-sized direct reads, up to [`RING_DEPTH`] in
/// flight, and hands each chunk to `each` in order as soon as it and every chunk before it are
/// in. Returns the bytes read (at least `min`); a short chunk ends the read there.
/// Reads the ring owes completions for; dropping it (also while unwinding) waits for all of
/// them, so no buffer is given back while the kernel may still write into it.
struct Inflight<'r> {
    ring: &'r mut IoUring,
    outstanding: usize,
    results: Vec<Option<i32>>,
}

impl Inflight<'_> {
    /// Waits for at least one completion and records every one that is in.
    fn reap(&mut self) {
        loop {
            match self.ring.submit_and_wait(1) {
                Ok(_) => break,
                Err(e)
                    if matches!(
                        e.raw_os_error(),
                        Some(libc::EINTR | libc::EAGAIN | libc::EBUSY)
                    ) => {}
                Err(e) => {
                    // The kernel may still be writing into buffers this thread is about to give
                    // back, and there is no way to wait for it: stop rather than corrupt memory.
                    // (A ring set up as here does not fail like this.)
                    tracing::error!("io_uring_enter failed with reads in flight: {e}; aborting");
                    std::process::abort();
                }
            }
        }
        for cqe in self.ring.completion() {
            if let Some(r) = self.results.get_mut(cqe.user_data() as usize) {
                *r = Some(cqe.result());
            }
            self.outstanding = self.outstanding.saturating_sub(1);
        }
    }
}

impl Drop for Inflight<'_> {
    fn drop(&mut self) {
        while self.outstanding > 0 {
            self.reap();
        }
    }
}

/// Reads `buf` (aligned) at `offset` as `chunk`-sized direct reads, up to [`RING_DEPTH`] in
/// flight, and hands each chunk to `each` in order as soon as it and every chunk before it are
/// in. Returns the bytes read (at least `min`); a short chunk ends the read there.
#[expect(
    unsafe_code,
    reason = "io_uring submissions name buffers the kernel fills later"
)]
fn uring_read_chunked(
    ring: &mut IoUring,
    file: &File,
    buf: &mut [u8],
    offset: u64,
    min: usize,
    chunk: usize,
    each: &mut dyn FnMut(&[u8]),
) -> io::Result<usize> {
    use std::os::fd::AsRawFd;
    // Disjoint chunks: the kernel fills some while `each` reads others.
    let mut chunks: Vec<&mut [u8]> = buf.chunks_mut(chunk).collect();
    let n = chunks.len();
    let mut flight = Inflight {
        ring,
        outstanding: 0,
        results: vec![None; n],
    };
    let (mut submitted, mut next) = (0usize, 0usize);
    let (mut got, mut ended, mut failure) = (0usize, false, None::<io::Error>);
    let fd = types::Fd(file.as_raw_fd());
    loop {
        // Keep the ring full while there is more to read and nothing has gone wrong.
        while submitted < n
            && flight.outstanding < RING_DEPTH as usize
            && failure.is_none()
            && !ended
        {
            let c = &mut chunks[submitted];
            let Ok(len) = u32::try_from(c.len()) else {
                failure = Some(io::Error::other("chunk too large"));
                break;
            };
            let entry = opcode::Read::new(fd, c.as_mut_ptr(), len)
                .offset(offset + (submitted * chunk) as u64)
                .build()
                .user_data(submitted as u64);
            // SAFETY: the entry points into `chunks[submitted]`, a part of `buf` that nothing
            // else reads or writes until its completion is reaped; `flight` is dropped (and
            // waits for every submitted read) before `chunks` and `buf` go out of scope, on
            // every path out of this function, unwinding included.
            if unsafe { flight.ring.submission().push(&entry) }.is_err() {
                break;
            }
            submitted += 1;
            flight.outstanding += 1;
        }
        if flight.outstanding == 0 {
            break;
        }
        flight.reap();
        // Hand over, in order, every chunk that is in.
        while next < n && failure.is_none() && !ended {
            let Some(res) = flight.results[next] else {
                break;
            };
            if res < 0 {
                failure = Some(io::Error::from_raw_os_error(-res));
                break;
            }
            let k = (res as usize).min(chunks[next].len());
            each(&chunks[next][..k]);
            got += k;
            if k < chunks[next].len() {
                ended = true; // the end of the file
            }
            next += 1;
        }
    }
    drop(flight);
    if let Some(e) = failure {
        return Err(e);
    }
    if got < min {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "file ends early",
        ));
    }
    Ok(got)
}

impl DirectIo {
    /// Checks that `dir` (created if missing) accepts an aligned `O_DIRECT` write and read, and
    /// returns the backend; the error says why not (the caller falls back to [`StdIo`]).
    pub fn probe(dir: &Path) -> io::Result<Self> {
        std::fs::create_dir_all(dir)?;
        Self::probe_in(dir)
    }

    /// As [`DirectIo::probe`], in an existing directory (nothing is created but the probe
    /// file, which is removed).
    pub fn probe_in(dir: &Path) -> io::Result<Self> {
        let path = dir.join(".orbitkv-direct-probe");
        let _ = std::fs::remove_file(&path);
        let result = (|| {
            let f = OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .custom_flags(libc::O_DIRECT)
                .open(&path)?;
            let (mut b, pad) = aligned_buffer(DIRECT_ALIGN);
            b[pad..].fill(0x5a);
            f.write_all_at(&b[pad..], 0)?;
            b[pad..].fill(0);
            f.read_exact_at(&mut b[pad..], 0)?;
            if b[pad..].iter().any(|x| *x != 0x5a) {
                return Err(io::Error::other("direct read returned other bytes"));
            }
            Ok(())
        })();
        let _ = std::fs::remove_file(&path);
        result.map(|()| Self::default())
    }
}

impl Io for DirectIo {
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Arc<dyn IoFile>> {
        let buffered = super::open_options(mode).open(path)?;
        let mut d = OpenOptions::new();
        d.read(true).custom_flags(libc::O_DIRECT);
        if mode != OpenMode::Read {
            d.write(true);
        }
        let direct = d.open(path)?;
        Ok(Arc::new(DirectFile { buffered, direct }))
    }
    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        self.dirs.create_dir_all(path)
    }
    fn list_dir(&self, path: &Path) -> io::Result<Vec<String>> {
        self.dirs.list_dir(path)
    }
    fn exists(&self, path: &Path) -> bool {
        self.dirs.exists(path)
    }
    fn remove_file(&self, path: &Path) -> io::Result<()> {
        self.dirs.remove_file(path)
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.dirs.rename(from, to)
    }
    fn sync_dir(&self, path: &Path) -> io::Result<()> {
        self.dirs.sync_dir(path)
    }
    fn lock_exclusive(&self, path: &Path) -> io::Result<Box<dyn Any + Send + Sync>> {
        self.dirs.lock_exclusive(path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_buffers_are_aligned_and_zeroed() {
        for len in [4096, 8192, 3 * 4096] {
            let (b, pad) = aligned_buffer(len);
            assert_eq!(b.len(), pad + len);
            assert!((b[pad..].as_ptr() as usize).is_multiple_of(DIRECT_ALIGN));
            assert!(b.iter().all(|x| *x == 0));
        }
    }

    #[test]
    fn chunked_reads_arrive_in_order_and_stop_at_the_end_of_the_file() -> io::Result<()> {
        let dir = tempfile::tempdir()?;
        let Ok(io) = DirectIo::probe(dir.path()) else {
            eprintln!("O_DIRECT unsupported here");
            return Ok(());
        };
        let f = io.open(&dir.path().join("f"), OpenMode::CreateNew)?;
        let len = 40 * DIRECT_ALIGN * 10 + 3 * DIRECT_ALIGN;
        let (mut b, pad) = aligned_buffer(len);
        for (i, x) in b[pad..].iter_mut().enumerate() {
            *x = (i % 251) as u8;
        }
        f.write_all_at(&b[pad..], 0)?;
        f.sync()?;
        // More chunks than the ring holds at once; the whole file.
        let (mut r, rp) = aligned_buffer(len);
        let mut seen = Vec::new();
        let mut calls = 0;
        let got = f.read_chunked(&mut r[rp..], 0, len, 8 * DIRECT_ALIGN, &mut |c| {
            seen.extend_from_slice(c);
            calls += 1;
        })?;
        assert_eq!(got, len);
        assert!(seen == b[pad..], "chunks out of order or wrong");
        assert!(calls >= 50);
        // A buffer reaching past the end: what the file has, and no more.
        let (mut r, rp) = aligned_buffer(len + 16 * DIRECT_ALIGN);
        let mut seen = Vec::new();
        let got = f.read_chunked(&mut r[rp..], 0, len, 8 * DIRECT_ALIGN, &mut |c| {
            seen.extend_from_slice(c);
        })?;
        assert_eq!(got, len);
        assert!(seen == b[pad..]);
        // Demanding more than the file has is an early end.
        let err = f
            .read_chunked(&mut r[rp..], 0, len + 1, 8 * DIRECT_ALIGN, &mut |_| {})
            .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
        Ok(())
    }

    #[test]
    fn aligned_and_unaligned_requests_round_trip() -> io::Result<()> {
        let dir = tempfile::tempdir()?;
        let Ok(io) = DirectIo::probe(dir.path()) else {
            // Not every file system takes O_DIRECT; the probe is what the store relies on.
            eprintln!("O_DIRECT unsupported here; the buffered path is covered by StdIo's tests");
            return Ok(());
        };
        let f = io.open(&dir.path().join("f"), OpenMode::CreateNew)?;
        let (mut b, pad) = aligned_buffer(2 * DIRECT_ALIGN);
        for (i, x) in b[pad..].iter_mut().enumerate() {
            *x = i as u8;
        }
        f.write_all_at(&b[pad..], 0)?;
        f.write_all_at(b"tail", 2 * DIRECT_ALIGN as u64)?;
        f.sync()?;
        assert_eq!(f.size()?, 2 * DIRECT_ALIGN as u64 + 4);
        let (mut r, rp) = aligned_buffer(2 * DIRECT_ALIGN);
        f.read_exact_at(&mut r[rp..], 0)?;
        assert_eq!(r[rp..], b[pad..]);
        let mut odd = [0u8; 7];
        f.read_exact_at(&mut odd, 2 * DIRECT_ALIGN as u64 - 3)?;
        assert_eq!(&odd[3..], b"tail");
        Ok(())
    }
}
