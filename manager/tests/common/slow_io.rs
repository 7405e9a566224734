//! A store backend whose file syncs take as long as the test says: the fault backend, with a
//! delay before each fsync, so a test can hold a Publish between its two replies.

use std::any::Any;
use std::io;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use orbitkv_store::io::fault::FaultIo;
use orbitkv_store::io::{Io, IoFile, OpenMode};
use orbitkv_store::{Durability, StateStore, StoreConfig};

/// The fault backend with slow file syncs.
#[derive(Clone, Default)]
pub struct SlowSync {
    inner: FaultIo,
    /// Milliseconds each file sync waits first.
    delay_ms: Arc<AtomicU64>,
    /// File syncs done.
    syncs: Arc<AtomicU64>,
}

impl SlowSync {
    /// From now on each file sync first waits `d`.
    pub fn set_delay(&self, d: Duration) {
        self.delay_ms.store(d.as_millis() as u64, Ordering::Release);
    }

    /// File syncs done so far.
    pub fn syncs(&self) -> u64 {
        self.syncs.load(Ordering::Acquire)
    }

    /// A store on it, holding records back until durable as `orbitkv serve` does.
    pub fn store(&self) -> Arc<StateStore> {
        let mut c = StoreConfig::new("data");
        c.durability = Durability::Group;
        let io: Arc<dyn Io> = Arc::new(self.clone());
        Arc::new(StateStore::open(io, c).unwrap_or_else(|e| panic!("{e}")))
    }
}

struct SlowFile {
    inner: Arc<dyn IoFile>,
    io: SlowSync,
}

impl IoFile for SlowFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<usize> {
        self.inner.write_at(buf, offset)
    }
    fn sync(&self) -> io::Result<()> {
        let ms = self.io.delay_ms.load(Ordering::Acquire);
        if ms > 0 {
            std::thread::sleep(Duration::from_millis(ms));
        }
        self.io.syncs.fetch_add(1, Ordering::AcqRel);
        self.inner.sync()
    }
    fn size(&self) -> io::Result<u64> {
        self.inner.size()
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.inner.set_len(len)
    }
}

impl Io for SlowSync {
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Arc<dyn IoFile>> {
        let inner = self.inner.open(path, mode)?;
        Ok(Arc::new(SlowFile {
            inner,
            io: self.clone(),
        }))
    }
    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        self.inner.create_dir_all(path)
    }
    fn list_dir(&self, path: &Path) -> io::Result<Vec<String>> {
        self.inner.list_dir(path)
    }
    fn exists(&self, path: &Path) -> bool {
        self.inner.exists(path)
    }
    fn remove_file(&self, path: &Path) -> io::Result<()> {
        self.inner.remove_file(path)
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.inner.rename(from, to)
    }
    fn sync_dir(&self, path: &Path) -> io::Result<()> {
        self.inner.sync_dir(path)
    }
    fn lock_exclusive(&self, path: &Path) -> io::Result<Box<dyn Any + Send + Sync>> {
        self.inner.lock_exclusive(path)
    }
}
