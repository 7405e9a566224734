//! A fault-injecting, in-memory file system for tests: it keeps what is durable apart from what
//! is only written, so [`FaultIo::crash`] can simulate power loss exactly — unsynced data is
//! dropped, and so are file creations, renames and removals whose directory was not synced —
//! and a [`FaultPlan`] fails chosen operations (the N-th write or sync with EIO, short writes,
//! ENOSPC past a byte budget, EIO on reads of chosen files).

use std::any::Any;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use super::{Io, IoFile, OpenMode};

/// Which operations fail.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FaultPlan {
    /// The N-th `write_at` (1-based, counted from when the plan is set) fails with EIO.
    pub fail_write: Option<u64>,
    /// Every `write_at` from the N-th on fails with EIO.
    pub fail_writes_from: Option<u64>,
    /// The N-th `write_at` writes only half its bytes.
    pub short_write: Option<u64>,
    /// The N-th file `sync` fails with EIO (its data is not made durable).
    pub fail_sync: Option<u64>,
    /// Writes that would take the bytes written past this fail with ENOSPC.
    pub space_bytes: Option<u64>,
    /// Reads of files whose path contains this fail with EIO.
    pub fail_reads_of: Option<String>,
}

/// Counts of operations seen.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FaultCounters {
    /// `write_at` calls.
    pub writes: u64,
    /// File `sync` calls.
    pub syncs: u64,
    /// Bytes written.
    pub bytes_written: u64,
    /// Bytes read.
    pub bytes_read: u64,
    /// Directory syncs.
    pub dir_syncs: u64,
}

#[derive(Debug, Default, Clone)]
struct Content {
    volatile: Vec<u8>,
    durable: Vec<u8>,
}

#[derive(Debug, Default)]
struct State {
    next_id: u64,
    contents: HashMap<u64, Content>,
    names: BTreeMap<PathBuf, u64>,
    durable_names: BTreeMap<PathBuf, u64>,
    dirs: BTreeSet<PathBuf>,
    locks: HashSet<PathBuf>,
    generation: u64,
    plan: FaultPlan,
    counters: FaultCounters,
}

/// The in-memory file system. Clones share it.
#[derive(Debug, Clone, Default)]
pub struct FaultIo {
    state: Arc<Mutex<State>>,
}

fn eio(what: &str) -> io::Error {
    io::Error::other(format!("injected EIO: {what}"))
}

impl FaultIo {
    /// An empty file system.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Replaces the fault plan and resets the counters it is measured against.
    pub fn set_plan(&self, plan: FaultPlan) {
        let mut s = self.lock();
        s.plan = plan;
        s.counters = FaultCounters::default();
    }

    /// Operation counts since the plan was set.
    pub fn counters(&self) -> FaultCounters {
        self.lock().counters
    }

    /// Power loss: every file reverts to its durable content, the namespace to its durable
    /// entries; open handles and locks die. With `keep_unsynced` = `Some(seed)`, each file that
    /// grew since its last sync keeps a pseudo-random prefix of the growth (a torn write).
    pub fn crash(&self, keep_unsynced: Option<u64>) {
        let mut s = self.lock();
        let mut x = keep_unsynced.unwrap_or(0) | 1;
        for c in s.contents.values_mut() {
            let mut next = c.durable.clone();
            if keep_unsynced.is_some() && c.volatile.len() > c.durable.len() {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let extra = (x % (c.volatile.len() - c.durable.len() + 1) as u64) as usize;
                let keep = c.durable.len() + extra;
                next = c.volatile[..keep].to_vec();
                c.durable.clone_from(&next);
            }
            c.volatile = next;
        }
        s.names = s.durable_names.clone();
        s.locks.clear();
        s.generation += 1;
        s.plan = FaultPlan::default();
    }

    /// The current (volatile) bytes of `path`, for tests that damage files.
    pub fn read_file(&self, path: &Path) -> Option<Vec<u8>> {
        let s = self.lock();
        let id = s.names.get(path)?;
        s.contents.get(id).map(|c| c.volatile.clone())
    }

    /// Overwrites the bytes of `path`, durably (damage that survives a crash).
    pub fn write_file(&self, path: &Path, bytes: &[u8]) -> bool {
        let mut s = self.lock();
        let Some(&id) = s.names.get(path) else {
            return false;
        };
        let Some(c) = s.contents.get_mut(&id) else {
            return false;
        };
        c.volatile = bytes.to_vec();
        c.durable = bytes.to_vec();
        true
    }
}

#[derive(Debug)]
struct FaultFile {
    io: FaultIo,
    id: u64,
    path: PathBuf,
    generation: u64,
    writable: bool,
}

impl FaultFile {
    fn state(&self) -> io::Result<MutexGuard<'_, State>> {
        let s = self.io.lock();
        if s.generation != self.generation {
            return Err(eio("handle from before a crash"));
        }
        Ok(s)
    }
}

impl IoFile for FaultFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let mut s = self.state()?;
        if s.plan
            .fail_reads_of
            .as_ref()
            .is_some_and(|p| self.path.to_string_lossy().contains(p.as_str()))
        {
            return Err(eio("read"));
        }
        let c = s
            .contents
            .get(&self.id)
            .ok_or_else(|| eio("file vanished"))?;
        let start = usize::try_from(offset)
            .unwrap_or(usize::MAX)
            .min(c.volatile.len());
        let n = buf.len().min(c.volatile.len() - start);
        buf[..n].copy_from_slice(&c.volatile[start..start + n]);
        s.counters.bytes_read += n as u64;
        Ok(n)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<usize> {
        if !self.writable {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                "read-only handle",
            ));
        }
        let mut s = self.state()?;
        s.counters.writes += 1;
        let n = s.counters.writes;
        if s.plan.fail_write == Some(n) || s.plan.fail_writes_from.is_some_and(|f| n >= f) {
            return Err(eio("write"));
        }
        if let Some(limit) = s.plan.space_bytes
            && s.counters.bytes_written + buf.len() as u64 > limit
        {
            return Err(io::Error::new(
                io::ErrorKind::StorageFull,
                "injected ENOSPC",
            ));
        }
        let len = if s.plan.short_write == Some(n) {
            buf.len() / 2
        } else {
            buf.len()
        };
        s.counters.bytes_written += len as u64;
        let c = s
            .contents
            .get_mut(&self.id)
            .ok_or_else(|| eio("file vanished"))?;
        let start = usize::try_from(offset).map_err(|_| eio("offset"))?;
        if c.volatile.len() < start + len {
            c.volatile.resize(start + len, 0);
        }
        c.volatile[start..start + len].copy_from_slice(&buf[..len]);
        Ok(len)
    }

    fn sync(&self) -> io::Result<()> {
        let mut s = self.state()?;
        s.counters.syncs += 1;
        if s.plan.fail_sync == Some(s.counters.syncs) {
            return Err(eio("fsync"));
        }
        let c = s
            .contents
            .get_mut(&self.id)
            .ok_or_else(|| eio("file vanished"))?;
        c.durable = c.volatile.clone();
        Ok(())
    }

    fn size(&self) -> io::Result<u64> {
        let s = self.state()?;
        Ok(s.contents
            .get(&self.id)
            .map_or(0, |c| c.volatile.len() as u64))
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        let mut s = self.state()?;
        let c = s
            .contents
            .get_mut(&self.id)
            .ok_or_else(|| eio("file vanished"))?;
        c.volatile
            .resize(usize::try_from(len).map_err(|_| eio("length"))?, 0);
        Ok(())
    }
}

struct LockGuard {
    io: FaultIo,
    path: PathBuf,
    generation: u64,
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        let mut s = self.io.lock();
        if s.generation == self.generation {
            s.locks.remove(&self.path);
        }
    }
}

impl Io for FaultIo {
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Arc<dyn IoFile>> {
        let mut s = self.lock();
        let parent = path.parent().unwrap_or(Path::new(""));
        let id = match (s.names.get(path).copied(), mode) {
            (Some(_), OpenMode::CreateNew) => {
                return Err(io::Error::new(io::ErrorKind::AlreadyExists, "exists"));
            }
            (Some(id), _) => id,
            (None, OpenMode::CreateNew) => {
                if !s.dirs.contains(parent) {
                    return Err(io::Error::new(io::ErrorKind::NotFound, "no such directory"));
                }
                s.next_id += 1;
                let id = s.next_id;
                s.contents.insert(id, Content::default());
                s.names.insert(path.to_owned(), id);
                id
            }
            (None, _) => return Err(io::Error::new(io::ErrorKind::NotFound, "no such file")),
        };
        Ok(Arc::new(FaultFile {
            io: self.clone(),
            id,
            path: path.to_owned(),
            generation: s.generation,
            writable: mode != OpenMode::Read,
        }))
    }

    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        let mut s = self.lock();
        let mut p = Some(path);
        while let Some(d) = p {
            if d.as_os_str().is_empty() {
                break;
            }
            s.dirs.insert(d.to_owned());
            p = d.parent();
        }
        s.dirs.insert(PathBuf::new());
        Ok(())
    }

    fn list_dir(&self, path: &Path) -> io::Result<Vec<String>> {
        let s = self.lock();
        if !s.dirs.contains(path) {
            return Err(io::Error::new(io::ErrorKind::NotFound, "no such directory"));
        }
        Ok(s.names
            .keys()
            .filter(|p| p.parent() == Some(path))
            .filter_map(|p| p.file_name()?.to_str().map(str::to_owned))
            .collect())
    }

    fn exists(&self, path: &Path) -> bool {
        let s = self.lock();
        s.names.contains_key(path) || s.dirs.contains(path)
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        let mut s = self.lock();
        s.names
            .remove(path)
            .map(|_| ())
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no such file"))
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut s = self.lock();
        let id = s
            .names
            .remove(from)
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no such file"))?;
        s.names.insert(to.to_owned(), id);
        Ok(())
    }

    fn sync_dir(&self, path: &Path) -> io::Result<()> {
        let mut s = self.lock();
        s.counters.dir_syncs += 1;
        let in_dir = |p: &PathBuf| p.parent() == Some(path);
        let volatile: Vec<(PathBuf, u64)> = s
            .names
            .iter()
            .filter(|(p, _)| in_dir(p))
            .map(|(p, i)| (p.clone(), *i))
            .collect();
        s.durable_names.retain(|p, _| !in_dir(p));
        s.durable_names.extend(volatile);
        Ok(())
    }

    fn lock_exclusive(&self, path: &Path) -> io::Result<Box<dyn Any + Send + Sync>> {
        let mut s = self.lock();
        if !s.locks.insert(path.to_owned()) {
            return Err(io::Error::new(io::ErrorKind::WouldBlock, "held"));
        }
        Ok(Box::new(LockGuard {
            io: self.clone(),
            path: path.to_owned(),
            generation: s.generation,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crash_drops_unsynced_data_and_names() {
        let io = FaultIo::new();
        let d = Path::new("d");
        io.create_dir_all(d).unwrap();
        let a = io.open(&d.join("a"), OpenMode::CreateNew).unwrap();
        a.write_all_at(b"hello", 0).unwrap();
        a.sync().unwrap();
        io.sync_dir(d).unwrap();
        a.write_all_at(b" world", 5).unwrap();
        let b = io.open(&d.join("b"), OpenMode::CreateNew).unwrap();
        b.write_all_at(b"x", 0).unwrap();
        b.sync().unwrap(); // data synced, but the directory entry is not
        io.crash(None);
        assert!(a.read_at(&mut [0u8; 1], 0).is_err(), "old handles die");
        assert_eq!(io.read_file(&d.join("a")).unwrap(), b"hello");
        assert!(!io.exists(&d.join("b")));
    }

    #[test]
    fn plans_fail_the_chosen_operations() {
        let io = FaultIo::new();
        io.create_dir_all(Path::new("d")).unwrap();
        let f = io.open(Path::new("d/f"), OpenMode::CreateNew).unwrap();
        io.set_plan(FaultPlan {
            fail_write: Some(2),
            short_write: Some(3),
            fail_sync: Some(1),
            space_bytes: Some(100),
            ..Default::default()
        });
        assert_eq!(f.write_at(&[1; 10], 0).unwrap(), 10);
        assert!(f.write_at(&[1; 10], 10).is_err());
        assert_eq!(f.write_at(&[1; 10], 10).unwrap(), 5);
        assert!(f.sync().is_err());
        assert_eq!(
            f.write_at(&[1; 200], 0).unwrap_err().kind(),
            io::ErrorKind::StorageFull
        );
        let _l = io.lock_exclusive(Path::new("d/LOCK")).unwrap();
        assert!(io.lock_exclusive(Path::new("d/LOCK")).is_err());
    }
}
