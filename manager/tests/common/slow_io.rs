//! A store backend whose file syncs take as long as the test says, and whose reads run the
//! test's code first: the fault backend, with a delay before each fsync (so a test can hold a
//! Publish between its two replies) and a hook before each read (so a test can act while the
//! store reads a record).

use std::any::Any;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use orbitkv_store::io::fault::FaultIo;
use orbitkv_store::io::{Io, IoFile, OpenMode};
use orbitkv_store::{Durability, StateStore, StoreConfig};

/// What runs before each file read: the file's path and the read's offset.
pub type ReadHook = Box<dyn FnMut(&Path, u64) + Send>;

/// The fault backend with slow file syncs and hooked reads.
#[derive(Clone, Default)]
pub struct SlowSync {
    inner: FaultIo,
    on_read: Arc<Mutex<Option<ReadHook>>>,
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

    /// From now on `hook` runs before each file read.
    pub fn set_read_hook(&self, hook: ReadHook) {
        *self.on_read.lock().unwrap_or_else(|e| e.into_inner()) = Some(hook);
    }

    /// The fault backend underneath (to read or damage files).
    pub fn fault(&self) -> &FaultIo {
        &self.inner
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
    path: PathBuf,
}

impl IoFile for SlowFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        if let Some(hook) = self
            .io
            .on_read
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_mut()
        {
            hook(&self.path, offset);
        }
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
            path: path.to_path_buf(),
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
