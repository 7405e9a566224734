//! The raw io_uring baseline: O_DIRECT writes through one ring with several in flight, as the
//! store writes its segments. This file holds the baseline's `unsafe` (a submission names a
//! buffer the kernel reads later).

#![expect(
    clippy::unwrap_used,
    reason = "a benchmark baseline: a failed setup step or write ends the run"
)]

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use io_uring::{IoUring, opcode, types};

/// Direct writes to one file through io_uring, at most `depth` in flight. The buffers written
/// are borrowed for `'a`; dropping the writer waits for every write in flight.
pub struct RawUring<'a> {
    file: File,
    ring: IoUring,
    depth: usize,
    in_flight: usize,
    _buffers: std::marker::PhantomData<&'a [u8]>,
}

impl<'a> RawUring<'a> {
    /// Creates (or truncates) `path` for O_DIRECT writes, `depth` (at least 1) in flight.
    pub fn create(path: &Path, depth: usize) -> Self {
        let file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .custom_flags(libc::O_DIRECT)
            .open(path)
            .unwrap();
        let depth = depth.max(1);
        Self {
            file,
            ring: IoUring::new(u32::try_from(depth * 2).unwrap()).unwrap(),
            depth,
            in_flight: 0,
            _buffers: std::marker::PhantomData,
        }
    }

    /// Writes `buf` (aligned for O_DIRECT) at `at`, once fewer than `depth` are in flight.
    #[expect(
        unsafe_code,
        reason = "io_uring submissions name buffers the kernel reads later"
    )]
    pub fn write(&mut self, buf: &'a [u8], at: u64) {
        self.wait(self.depth - 1);
        let e = opcode::Write::new(
            types::Fd(self.file.as_raw_fd()),
            buf.as_ptr(),
            u32::try_from(buf.len()).unwrap(),
        )
        .offset(at)
        .build()
        .user_data(buf.len() as u64);
        // SAFETY: `buf` is borrowed for `'a`, which outlives this writer, and every write in
        // flight is waited for before the writer is dropped.
        unsafe { self.ring.submission().push(&e) }.unwrap();
        self.ring.submit().unwrap();
        self.in_flight += 1;
    }

    /// Waits until at most `keep` writes are in flight; a short or failed write ends the run.
    pub fn wait(&mut self, keep: usize) {
        while self.in_flight > keep {
            self.ring.submit_and_wait(1).unwrap();
            for c in self.ring.completion() {
                assert_eq!(
                    i64::from(c.result()),
                    c.user_data() as i64,
                    "short or failed write"
                );
                self.in_flight -= 1;
            }
        }
    }

    /// Waits for every write in flight, then `fdatasync`.
    pub fn sync(&mut self) {
        self.wait(0);
        self.file.sync_data().unwrap();
    }
}

impl Drop for RawUring<'_> {
    fn drop(&mut self) {
        while self.in_flight > 0 {
            if self.ring.submit_and_wait(1).is_err() {
                return;
            }
            let done = self.ring.completion().count();
            self.in_flight = self.in_flight.saturating_sub(done);
        }
    }
}
