//! The portable backend: real files, positioned `pread`/`pwrite`, `fdatasync`, `flock`.

use std::any::Any;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;

use super::{Io, IoFile, OpenMode};

/// Real files through the standard library.
#[derive(Debug, Default, Clone, Copy)]
pub struct StdIo;

#[derive(Debug)]
struct StdFile(File);

impl IoFile for StdFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.0.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<usize> {
        self.0.write_at(buf, offset)
    }
    fn sync(&self) -> io::Result<()> {
        self.0.sync_data()
    }
    fn size(&self) -> io::Result<u64> {
        Ok(self.0.metadata()?.len())
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.0.set_len(len)
    }
    fn preallocate(&self, len: u64) -> io::Result<()> {
        fallocate_keep_size(&self.0, len)
    }
    fn punch_hole(&self, offset: u64, len: u64) -> io::Result<()> {
        super::sparse::punch_hole(&self.0, offset, len)
    }
    fn holes(&self) -> io::Result<Vec<(u64, u64)>> {
        super::sparse::holes(&self.0)
    }
}

impl Io for StdIo {
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Arc<dyn IoFile>> {
        Ok(Arc::new(StdFile(super::open_options(mode).open(path)?)))
    }
    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        fs::create_dir_all(path)
    }
    fn list_dir(&self, path: &Path) -> io::Result<Vec<String>> {
        let mut out = Vec::new();
        for e in fs::read_dir(path)? {
            let e = e?;
            if e.file_type()?.is_file()
                && let Some(name) = e.file_name().to_str()
            {
                out.push(name.to_owned());
            }
        }
        out.sort();
        Ok(out)
    }
    fn exists(&self, path: &Path) -> bool {
        path.exists()
    }
    fn remove_file(&self, path: &Path) -> io::Result<()> {
        fs::remove_file(path)
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        fs::rename(from, to)
    }
    fn sync_dir(&self, path: &Path) -> io::Result<()> {
        File::open(path)?.sync_all()
    }
    fn lock_exclusive(&self, path: &Path) -> io::Result<Box<dyn Any + Send + Sync>> {
        let made = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path);
        let f = match made {
            Ok(f) => f,
            // A read-only file system or lock file: flock needs no write access, so an existing
            // lock file is locked read-only.
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::ReadOnlyFilesystem | io::ErrorKind::PermissionDenied
                ) =>
            {
                File::open(path).map_err(|_| e)?
            }
            Err(e) => return Err(e),
        };
        match f.try_lock() {
            Ok(()) => Ok(Box::new(f)),
            Err(fs::TryLockError::WouldBlock) => Err(io::Error::new(
                io::ErrorKind::WouldBlock,
                "held by another process",
            )),
            Err(fs::TryLockError::Error(e)) => Err(e),
        }
    }
}

/// `fallocate(FALLOC_FL_KEEP_SIZE)` over `0..len`.
#[expect(unsafe_code, reason = "fallocate has no safe wrapper in std")]
pub(crate) fn fallocate_keep_size(f: &File, len: u64) -> io::Result<()> {
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
