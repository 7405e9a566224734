//! The io_uring backend, the default on Linux: verified reads are streamed through a per-thread
//! ring (several chunks in flight, the caller's copy and checksum overlapping the transfer) and
//! appends are submitted asynchronously through a per-file ring (several writes in flight, the
//! putter encoding its next bundle meanwhile). Where the kernel refuses a ring, the same calls
//! run synchronously.
//!
//! With `O_DIRECT` ([`UringIo::probe`]), each file is open twice, once with `O_DIRECT` and once
//! buffered. A read or write whose buffer address, file offset and length are all multiples of
//! [`DIRECT_ALIGN`] goes through the direct descriptor (no page-cache copy; this machine's page
//! cache caps buffered writes at a third of what the device does); anything else (segment
//! headers, footers, the manifest, scans) goes through the buffered one. Linux keeps the two
//! coherent: a direct write invalidates the cached pages it covers, and a direct read first
//! writes back dirty cached pages in its range. Segments written with
//! [`orbitkv_segments::Alignment::Direct`] put every frame on a 4 KiB boundary with a 4 KiB
//! multiple length, so appends and verified reads of whole frames are direct. Some file systems
//! (tmpfs, some overlay mounts) refuse `O_DIRECT`: [`UringIo::buffered`] is the backend there,
//! and for the offline tools that must not create a probe file.
//! Its unit tests take the last 150 lines.

use std::any::Any;
use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock};

use io_uring::{IoUring, opcode, types};

use super::aligned::{DIRECT_ALIGN, aligned_buffer, is_aligned};
use super::std_io::{StdIo, fallocate_keep_size};
use super::{Io, IoFile, OpenMode, WriteBuf};

/// Real files through io_uring, with `O_DIRECT` for aligned requests when probed.
#[derive(Debug, Default, Clone, Copy)]
pub struct UringIo {
    dirs: StdIo,
    o_direct: bool,
}

/// Whether this kernel gives a process an io_uring (probed once; seccomp filters and
/// `kernel.io_uring_disabled` refuse it).
pub fn available() -> bool {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    *AVAILABLE.get_or_init(|| match IoUring::new(2) {
        Ok(_) => true,
        Err(e) => {
            tracing::info!("io_uring is not available: {e}; I/O runs synchronously");
            false
        }
    })
}

struct UringFile {
    buffered: File,
    /// The `O_DIRECT` descriptor, when the backend uses it.
    direct: Option<File>,
    /// The file's write ring, made on the first write submitted asynchronously (`Some(None)`:
    /// the kernel refused one; writes are then synchronous).
    writes: Mutex<Option<Option<WriteRing>>>,
}

/// Writes in flight on one file through its own io_uring: each holds its buffer (so the kernel
/// never reads freed memory) until its completion is reaped.
struct WriteRing {
    ring: IoUring,
    /// By submission id: the buffer and the file offset it goes to (and, for a vectored
    /// write, the `iovec`s the kernel reads).
    in_flight: HashMap<u64, InFlight>,
    next_id: u64,
    /// Offsets of writes completed and not yet reported.
    completed: Vec<u64>,
    /// The first failure not yet reported.
    failure: Option<io::Error>,
    /// The kernel stopped answering: buffers in flight are never given back.
    broken: bool,
}

/// A write in flight: its bytes, where they go, and the `iovec`s of a vectored write.
struct InFlight {
    buf: Arc<WriteBuf>,
    offset: u64,
    _iovecs: Option<Iovecs>,
}

/// `iovec`s held until their write completes.
struct Iovecs(#[expect(dead_code, reason = "held for the kernel, never read")] Box<[libc::iovec]>);

// SAFETY: the `iovec`s point into the buffers of the `WriteBuf` held beside them, which is
// `Send + Sync` and immutable while shared; nothing dereferences them but the kernel.
#[expect(unsafe_code, reason = "raw pointers held for the kernel")]
unsafe impl Send for Iovecs {}

/// Writes in flight at once per file.
const WRITE_RING_DEPTH: u32 = 8;

/// Parts one vectored write takes at most (`IOV_MAX`); a longer list is written synchronously.
const MAX_IOVECS: usize = 1024;

impl UringFile {
    /// The descriptor for a request of `len` bytes at `ptr` and `offset`: the direct one when
    /// there is one and the request is aligned.
    fn fd_for(&self, ptr: *const u8, len: usize, offset: u64) -> &File {
        match &self.direct {
            Some(d) if is_aligned(ptr, len, offset) => d,
            _ => &self.buffered,
        }
    }
}

impl IoFile for UringFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        if let Some(direct) = &self.direct
            && is_aligned(buf.as_ptr(), buf.len(), offset)
        {
            match direct.read_at(buf, offset) {
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
        // Whole blocks, so each chunk of an aligned buffer is itself aligned.
        let chunk = chunk.next_multiple_of(DIRECT_ALIGN);
        if buf.len() > chunk {
            let fd = self.fd_for(buf.as_ptr(), buf.len(), offset);
            let done = RING.with_borrow_mut(|ring| {
                let ring = ring.get_or_insert_with(|| {
                    IoUring::new(RING_DEPTH)
                        .inspect_err(|e| {
                            tracing::info!("io_uring unavailable, reading synchronously: {e}");
                        })
                        .ok()
                });
                ring.as_mut()
                    .map(|r| uring_read_chunked(r, fd, buf, offset, min, chunk, each))
            });
            if let Some(r) = done {
                return r;
            }
        }
        super::read_then_hand_over(self, buf, offset, min, chunk, each)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<usize> {
        self.fd_for(buf.as_ptr(), buf.len(), offset)
            .write_at(buf, offset)
    }
    #[expect(
        unsafe_code,
        reason = "an io_uring write names a buffer the kernel reads later"
    )]
    fn submit_write(&self, buf: &Arc<WriteBuf>, offset: u64) -> io::Result<bool> {
        // One `iovec` per part; each stays valid while `buf` is held (below).
        let iovecs: Box<[libc::iovec]> = buf
            .parts()
            .map(|p| libc::iovec {
                iov_base: p.as_ptr() as *mut libc::c_void,
                iov_len: p.len(),
            })
            .collect();
        let total = buf.len();
        let (Ok(len), Ok(count)) = (u32::try_from(total), u32::try_from(iovecs.len())) else {
            return self.write_buf_at(buf, 0, offset).map(|()| true);
        };
        if iovecs.is_empty() || iovecs.len() > MAX_IOVECS {
            return self.write_buf_at(buf, 0, offset).map(|()| true);
        }
        let mut guard = self.writes.lock().unwrap_or_else(|e| e.into_inner());
        let made = guard.get_or_insert_with(|| {
            IoUring::new(WRITE_RING_DEPTH)
                .inspect_err(|e| tracing::info!("io_uring unavailable, writing synchronously: {e}"))
                .ok()
                .map(|ring| WriteRing {
                    ring,
                    in_flight: HashMap::new(),
                    next_id: 0,
                    completed: Vec::new(),
                    failure: None,
                    broken: false,
                })
        });
        let Some(w) = made.as_mut().filter(|w| !w.broken) else {
            drop(guard);
            return self.write_buf_at(buf, 0, offset).map(|()| true);
        };
        // A full ring: wait for one slot.
        while w.in_flight.len() >= WRITE_RING_DEPTH as usize {
            w.reap(self, true);
            if w.broken {
                return Err(io::Error::other("io_uring stopped answering"));
            }
        }
        let id = w.next_id;
        w.next_id += 1;
        // Direct only when every part is on the alignment, as one direct request needs.
        let direct = buf
            .parts()
            .enumerate()
            .all(|(i, p)| is_aligned(p.as_ptr(), p.len(), if i == 0 { offset } else { 0 }));
        let fd = match (&self.direct, direct) {
            (Some(d), true) => d,
            _ => &self.buffered,
        };
        let fd = types::Fd(fd.as_raw_fd());
        let (entry, held) = if iovecs.len() == 1 {
            let entry = opcode::Write::new(fd, iovecs[0].iov_base as *const u8, len);
            (entry.offset(offset).build(), None)
        } else {
            let entry = opcode::Writev::new(fd, iovecs.as_ptr(), count);
            (entry.offset(offset).build(), Some(Iovecs(iovecs)))
        };
        // SAFETY: the entry reads `len` bytes from `buf`'s heap buffers (through the `iovec`s
        // of a vectored write, whose own heap array moves with `held` but stays in place), all of
        // which stay allocated and unchanged until the completion is reaped: a clone of the `Arc`
        // and the `iovec`s are kept in `in_flight` until then (nobody can mutate through a shared
        // `Arc`), and dropping the file waits for every write in flight or, if the kernel stops
        // answering, leaks them.
        if unsafe { w.ring.submission().push(&entry.user_data(id)) }.is_err() {
            drop(guard);
            return self.write_buf_at(buf, 0, offset).map(|()| true);
        }
        w.submitted(id, buf, offset, held);
        Ok(false)
    }
    fn complete_writes(&self, in_flight: usize) -> io::Result<Vec<u64>> {
        let mut guard = self.writes.lock().unwrap_or_else(|e| e.into_inner());
        let Some(Some(w)) = guard.as_mut() else {
            return Ok(Vec::new());
        };
        // What has completed already, without waiting.
        w.reap(self, false);
        let mut keep = in_flight;
        while w.in_flight.len() > keep && !w.broken {
            w.reap(self, true);
            if w.failure.is_some() {
                keep = 0; // a failure: wait for everything, then report it
            }
        }
        if w.broken {
            return Err(io::Error::other(
                "io_uring stopped answering with writes in flight",
            ));
        }
        let done = std::mem::take(&mut w.completed);
        match w.failure.take() {
            // The rest was waited for above.
            Some(e) => Err(e),
            None => Ok(done),
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
    fn punch_hole(&self, offset: u64, len: u64) -> io::Result<()> {
        super::sparse::punch_hole(&self.buffered, offset, len)
    }
    fn holes(&self) -> io::Result<Vec<(u64, u64)>> {
        super::sparse::holes(&self.buffered)
    }
}

impl WriteRing {
    /// Notes the write `id` the ring took, holding what it reads, and tells the kernel.
    fn submitted(&mut self, id: u64, buf: &Arc<WriteBuf>, offset: u64, iovecs: Option<Iovecs>) {
        self.in_flight.insert(
            id,
            InFlight {
                buf: Arc::clone(buf),
                offset,
                _iovecs: iovecs,
            },
        );
        if let Err(e) = self.ring.submit() {
            // The kernel did not take the entry: it may still, so the buffer stays held; a
            // later wait finds out (or the file leaks it if the ring is gone for good).
            tracing::warn!("io_uring submit: {e}");
        }
    }

    /// Reaps completions (waiting for one first when `wait`) into `completed`. A short write is
    /// finished synchronously; a failed one is kept in `failure`.
    fn reap(&mut self, file: &UringFile, wait: bool) {
        if wait && let Err(e) = wait_for_one(&mut self.ring) {
            tracing::error!("io_uring_enter failed with writes in flight: {e}");
            self.broken = true;
            return;
        }
        let completions: Vec<(u64, i32)> = self
            .ring
            .completion()
            .map(|c| (c.user_data(), c.result()))
            .collect();
        for (id, res) in completions {
            let Some(InFlight { buf, offset, .. }) = self.in_flight.remove(&id) else {
                continue;
            };
            let outcome = if res < 0 {
                Err(io::Error::from_raw_os_error(-res))
            } else {
                let n = (res as usize).min(buf.len());
                if n == 0 {
                    Err(io::Error::new(io::ErrorKind::WriteZero, "write returned 0"))
                } else {
                    // The rest of a short write, synchronously.
                    file.write_buf_at(&buf, n, offset)
                }
            };
            match outcome {
                Ok(()) => self.completed.push(offset),
                Err(e) => {
                    self.failure.get_or_insert(e);
                }
            }
        }
    }
}

impl Drop for UringFile {
    fn drop(&mut self) {
        let w = self.writes.get_mut().unwrap_or_else(|e| e.into_inner());
        if let Some(Some(mut ring)) = w.take() {
            while !ring.in_flight.is_empty() && !ring.broken {
                ring.reap(self, true);
            }
            if ring.broken {
                // The kernel may still read these buffers: never free them.
                std::mem::forget(ring);
            }
        }
    }
}

/// Reads in flight at once per reader thread.
const RING_DEPTH: u32 = 16;

thread_local! {
    /// Each reader thread's ring, made on first use (`None`: the kernel refused one).
    static RING: std::cell::RefCell<Option<Option<IoUring>>> =
        const { std::cell::RefCell::new(None) };
}

/// Submits what is queued and waits for at least one completion, retrying interruptions and
/// a busy completion queue; any other error means the kernel stopped answering.
fn wait_for_one(ring: &mut IoUring) -> io::Result<()> {
    loop {
        match ring.submit_and_wait(1) {
            Ok(_) => return Ok(()),
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EINTR | libc::EAGAIN | libc::EBUSY)
                ) => {}
            Err(e) => return Err(e),
        }
    }
}

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
        if let Err(e) = wait_for_one(self.ring) {
            // The kernel may still be writing into buffers this thread is about to give back,
            // and there is no way to wait for it: stop rather than corrupt memory. (A ring set
            // up as here does not fail like this.)
            tracing::error!("io_uring_enter failed with reads in flight: {e}; aborting");
            std::process::abort();
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

impl UringIo {
    /// The backend without `O_DIRECT`: every request through the page cache (io_uring still
    /// carries the streamed reads and the asynchronous writes). Probes nothing, creates nothing.
    pub fn buffered() -> Self {
        Self::default()
    }

    /// Whether requests that are aligned go direct.
    pub fn is_direct(&self) -> bool {
        self.o_direct
    }

    /// Checks that `dir` (created if missing) accepts an aligned `O_DIRECT` write and read, and
    /// returns the backend with `O_DIRECT`; the error says why not (the caller falls back to
    /// [`UringIo::buffered`]).
    pub fn probe(dir: &Path) -> io::Result<Self> {
        std::fs::create_dir_all(dir)?;
        Self::probe_in(dir)
    }

    /// As [`UringIo::probe`], in an existing directory (nothing is created but the probe
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
        result.map(|()| Self {
            o_direct: true,
            ..Self::default()
        })
    }
}

impl Io for UringIo {
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Arc<dyn IoFile>> {
        let buffered = super::open_options(mode).open(path)?;
        let direct = if self.o_direct {
            let mut d = OpenOptions::new();
            d.read(true).custom_flags(libc::O_DIRECT);
            if mode != OpenMode::Read {
                d.write(true);
            }
            Some(d.open(path)?)
        } else {
            None
        };
        Ok(Arc::new(UringFile {
            buffered,
            direct,
            writes: Mutex::new(None),
        }))
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

    /// Paths this machine may lack: reported `SKIPPED:`, or a failure where the environment
    /// requires them (as in the integration tests).
    mod require {
        #![allow(dead_code, reason = "shared with the integration tests")]
        include!("../../tests/common/require.rs");
    }

    /// The buffered backend, and the direct one where the file system takes `O_DIRECT`.
    fn backends(dir: &Path) -> Vec<UringIo> {
        if !available() {
            let why = "the kernel refuses a ring; the I/O runs synchronously";
            require::skipped(require::REQUIRE_URING, "io_uring", &why);
        }
        let mut v = vec![UringIo::buffered()];
        let what = format!("O_DIRECT in {}", dir.display());
        v.extend(require::or_skip(
            UringIo::probe(dir),
            require::REQUIRE_DIRECT,
            &what,
        ));
        v
    }

    #[test]
    fn chunked_reads_arrive_in_order_and_stop_at_the_end_of_the_file() -> io::Result<()> {
        let dir = tempfile::tempdir()?;
        for (n, io) in backends(dir.path()).into_iter().enumerate() {
            chunked_reads_on(&io, &dir.path().join(format!("f{n}")))?;
        }
        Ok(())
    }

    fn chunked_reads_on(io: &UringIo, path: &Path) -> io::Result<()> {
        let f = io.open(path, OpenMode::CreateNew)?;
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
    fn writes_submitted_through_the_ring_complete_in_the_file() -> io::Result<()> {
        let dir = tempfile::tempdir()?;
        for (n, io) in backends(dir.path()).into_iter().enumerate() {
            ring_writes_on(&io, &dir.path().join(format!("f{n}")))?;
        }
        Ok(())
    }

    fn ring_writes_on(io: &UringIo, path: &Path) -> io::Result<()> {
        let f = io.open(path, OpenMode::CreateNew)?;
        let block = 64 * DIRECT_ALIGN;
        let mut bufs = Vec::new();
        let mut in_flight = 0;
        // More writes than the ring holds: submitting waits for a slot.
        for i in 0..(2 * WRITE_RING_DEPTH as usize + 3) {
            let (mut b, pad) = aligned_buffer(block);
            b[pad..].fill(i as u8 + 1);
            let b = Arc::new(WriteBuf::new(b, pad));
            if !f.submit_write(&b, (i * block) as u64)? {
                in_flight += 1;
            }
            bufs.push(b);
        }
        // Every write left in flight is reported complete once, also those reaped while
        // waiting for a slot.
        let done = f.complete_writes(0)?;
        if in_flight == 0 {
            let why = "no write stayed in flight: they were synchronous";
            require::skipped(require::REQUIRE_URING, "io_uring writes", &why);
        }
        assert_eq!(done.len(), in_flight);
        assert!(f.complete_writes(0)?.is_empty(), "nothing left in flight");
        let mut r = vec![0u8; block];
        for (i, _) in bufs.iter().enumerate() {
            f.read_exact_at(&mut r, (i * block) as u64)?;
            assert!(r.iter().all(|x| *x == i as u8 + 1), "block {i}");
        }
        // An unaligned buffer goes through the page cache, also in flight.
        let at = (bufs.len() * block) as u64;
        let odd = Arc::new(WriteBuf::new(b"tail".to_vec(), 0));
        let left = !f.submit_write(&odd, at)?;
        assert_eq!(f.complete_writes(0)?.len(), usize::from(left));
        let mut tail = [0u8; 4];
        f.read_exact_at(&mut tail, at)?;
        assert_eq!(&tail, b"tail");
        Ok(())
    }

    #[test]
    fn aligned_and_unaligned_requests_round_trip() -> io::Result<()> {
        let dir = tempfile::tempdir()?;
        // Not every file system takes O_DIRECT; the probe is what the store relies on.
        let what = format!("O_DIRECT in {}", dir.path().display());
        let Some(io) = require::or_skip(UringIo::probe(dir.path()), require::REQUIRE_DIRECT, &what)
        else {
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
