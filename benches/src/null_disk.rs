//! A backend over another whose large writes complete at once without reaching the disk: the
//! daemon's own ceiling (copies, checksums, the encoder and committer, the socket) measured as
//! if the disk took no time. Only for benches that never read back what they wrote.

use std::any::Any;
use std::io;
use std::path::Path;
use std::sync::Arc;

use orbitkv_store::io::{Io, IoFile, OpenMode, WriteBuf};

/// Writes of at least this many bytes are dropped: the store's bundles of frames. Headers,
/// footers and the manifest are smaller and reach the disk, so segments still seal and open.
pub const DROPPED_FROM: usize = 1 << 20;

/// [`Io`] over `inner`, dropping payload writes (see the module).
pub struct NullDisk(pub Arc<dyn Io>);

struct NullFile(Arc<dyn IoFile>);

impl IoFile for NullFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.0.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<usize> {
        if buf.len() >= DROPPED_FROM {
            return Ok(buf.len());
        }
        self.0.write_at(buf, offset)
    }
    fn sync(&self) -> io::Result<()> {
        self.0.sync()
    }
    fn size(&self) -> io::Result<u64> {
        self.0.size()
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.0.set_len(len)
    }
    fn preallocate(&self, len: u64) -> io::Result<()> {
        self.0.preallocate(len)
    }
    fn submit_write(&self, buf: &Arc<WriteBuf>, offset: u64) -> io::Result<bool> {
        if buf.len() >= DROPPED_FROM {
            return Ok(true);
        }
        self.0.submit_write(buf, offset)
    }
    fn complete_writes(&self, in_flight: usize) -> io::Result<Vec<u64>> {
        self.0.complete_writes(in_flight)
    }
    fn write_buf_at(&self, buf: &WriteBuf, from: usize, offset: u64) -> io::Result<()> {
        if buf.len() >= DROPPED_FROM {
            return Ok(());
        }
        self.0.write_buf_at(buf, from, offset)
    }
}

impl Io for NullDisk {
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Arc<dyn IoFile>> {
        Ok(Arc::new(NullFile(self.0.open(path, mode)?)))
    }
    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        self.0.create_dir_all(path)
    }
    fn list_dir(&self, path: &Path) -> io::Result<Vec<String>> {
        self.0.list_dir(path)
    }
    fn exists(&self, path: &Path) -> bool {
        self.0.exists(path)
    }
    fn remove_file(&self, path: &Path) -> io::Result<()> {
        self.0.remove_file(path)
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.0.rename(from, to)
    }
    fn sync_dir(&self, path: &Path) -> io::Result<()> {
        self.0.sync_dir(path)
    }
    fn lock_exclusive(&self, path: &Path) -> io::Result<Box<dyn Any + Send + Sync>> {
        self.0.lock_exclusive(path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn large_writes_are_dropped_and_small_ones_kept() -> io::Result<()> {
        let dir = tempfile::tempdir()?;
        let io = NullDisk(Arc::new(orbitkv_store::io::std_io::StdIo));
        let f = io.open(&dir.path().join("f"), OpenMode::CreateNew)?;
        f.write_all_at(b"head", 0)?;
        let big = Arc::new(WriteBuf::new(vec![7u8; DROPPED_FROM], 0));
        assert!(
            f.submit_write(&big, 4)?,
            "a dropped write is complete at once"
        );
        f.write_buf_at(&big, 0, 4)?;
        assert_eq!(f.write_at(&vec![7u8; DROPPED_FROM], 4)?, DROPPED_FROM);
        assert_eq!(f.size()?, 4, "nothing of the large writes reached the file");
        let mut b = [0u8; 4];
        f.read_exact_at(&mut b, 0)?;
        assert_eq!(&b, b"head");
        Ok(())
    }
}
