//! A fault-injecting, in-memory file system for tests: it keeps what is durable apart from what
//! is only written, so [`FaultIo::crash`] can simulate power loss — unsynced data is dropped (or
//! torn: a prefix, or any subset of its 4 KiB pages, persists), and so are file creations,
//! renames and removals whose directory was not synced — and a [`FaultPlan`] fails chosen
//! operations: the N-th write, sync or directory sync with EIO, short writes, ENOSPC past a byte
//! budget, EIO on reads or opens of chosen files, and a halt after the N-th mutating operation
//! (every later one fails), so a crash can land inside any multi-step update.
//!
//! As on Linux, data whose fsync failed is never made durable by a later fsync (its pages were
//! marked clean); it stays readable until the crash. Directories themselves are durable once
//! created.
//! Its unit tests take the last 120 lines.

use orbitkv_testkit::Xorshift;
use std::any::Any;
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use super::{Io, IoFile, OpenMode, WriteBuf};

/// Which operations fail.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FaultPlan {
    /// The N-th `write_at` (1-based, counted from when the plan is set) fails with EIO.
    pub fail_write: Option<u64>,
    /// Every `write_at` from the N-th on fails with EIO.
    pub fail_writes_from: Option<u64>,
    /// The N-th `write_at` writes only half its bytes.
    pub short_write: Option<u64>,
    /// The N-th file `sync` fails with EIO (its data is never made durable).
    pub fail_sync: Option<u64>,
    /// Writes that would take the bytes written past this fail with ENOSPC.
    pub space_bytes: Option<u64>,
    /// Reads of files whose path contains this fail with EIO.
    pub fail_reads_of: Option<String>,
    /// Writes to files whose path contains this fail with EIO.
    pub fail_writes_of: Option<String>,
    /// Reads covering this byte of files whose path contains this fail with EIO (a bad
    /// sector).
    pub fail_read_at: Option<(String, u64)>,
    /// Opens of files whose path contains this fail (as EMFILE would).
    pub fail_opens_of: Option<String>,
    /// The N-th directory sync fails with EIO (the entries stay volatile).
    pub fail_sync_dir: Option<u64>,
    /// After N mutating operations (writes, syncs, directory syncs, creations, renames,
    /// removals, truncations) every further one fails with EIO: the process "dies" there.
    pub halt_after_ops: Option<u64>,
    /// Writes submitted asynchronously ([`IoFile::submit_write`]) stay in flight — absent from
    /// the file, lost by a crash — until [`IoFile::complete_writes`] applies them (as `write_at`
    /// calls, so the other faults hit them there), oldest first.
    pub defer_writes: bool,
    /// Locks fail with this kind, the lock file made by none (as a read-only file system
    /// refuses it).
    pub refuse_locks: Option<io::ErrorKind>,
    /// Hole punches fail with this kind (`Unsupported`: a file system without holes).
    pub refuse_punches: Option<io::ErrorKind>,
}

/// What survives [`FaultIo::crash`] of the data written since the last sync.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Crash {
    /// Nothing.
    DropUnsynced,
    /// A pseudo-random prefix of each file's growth (a torn append).
    TornPrefix(u64),
    /// A pseudo-random subset of each file's unsynced 4 KiB pages; the others read as zeros.
    TornPages(u64),
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
    /// Mutating operations (what `halt_after_ops` counts).
    pub ops: u64,
}

#[derive(Debug, Default, Clone)]
struct Content {
    volatile: Vec<u8>,
    durable: Vec<u8>,
    /// Byte ranges whose fsync failed: never made durable by a later sync.
    lost: Vec<(usize, usize)>,
    /// Punched ranges (whole 4 KiB pages), in no order; a write into one fills it.
    holes: Vec<(usize, usize)>,
    /// The holes as of the last good sync: what a crash keeps.
    durable_holes: Vec<(usize, usize)>,
}

/// Removes `a..b` from `ranges`.
fn cut(ranges: &mut Vec<(usize, usize)>, a: usize, b: usize) {
    if ranges.is_empty() {
        return;
    }
    let mut kept = Vec::with_capacity(ranges.len() + 1);
    for &(x, y) in ranges.iter() {
        if y <= a || x >= b {
            kept.push((x, y));
            continue;
        }
        if x < a {
            kept.push((x, a));
        }
        if y > b {
            kept.push((b, y));
        }
    }
    *ranges = kept;
}

impl Content {
    /// Removes `a..b` from the lost ranges.
    fn rewritten(&mut self, a: usize, b: usize) {
        cut(&mut self.lost, a, b);
    }

    /// Drops `a..b` from the holes (written again).
    fn filled(&mut self, a: usize, b: usize) {
        cut(&mut self.holes, a, b);
    }

    /// `bytes` with the lost ranges zeroed.
    fn without_lost(&self, mut bytes: Vec<u8>) -> Vec<u8> {
        for &(a, b) in &self.lost {
            for byte in bytes.iter_mut().take(b).skip(a) {
                *byte = 0;
            }
        }
        bytes
    }
}

#[derive(Debug, Default)]
struct State {
    next_id: u64,
    contents: BTreeMap<u64, Content>,
    names: BTreeMap<PathBuf, u64>,
    durable_names: BTreeMap<PathBuf, u64>,
    dirs: BTreeSet<PathBuf>,
    locks: HashSet<PathBuf>,
    generation: u64,
    plan: FaultPlan,
    counters: FaultCounters,
}

impl State {
    /// Counts a mutating operation; fails once the plan's halt point has passed.
    fn op(&mut self) -> io::Result<()> {
        self.counters.ops += 1;
        if self
            .plan
            .halt_after_ops
            .is_some_and(|h| self.counters.ops > h)
        {
            return Err(eio("halted"));
        }
        Ok(())
    }

    fn matches(pattern: Option<&String>, path: &Path) -> bool {
        pattern.is_some_and(|p| path.to_string_lossy().contains(p.as_str()))
    }
}

/// The in-memory file system. Clones share it.
#[derive(Debug, Clone, Default)]
pub struct FaultIo {
    state: Arc<Mutex<State>>,
}

fn eio(what: &str) -> io::Error {
    io::Error::other(format!("injected EIO: {what}"))
}

fn not_found(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::NotFound, what.to_owned())
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

    /// Power loss: every file reverts to its durable content (plus what `mode` lets survive of
    /// its unsynced growth), the namespace to its durable entries; open handles and locks die,
    /// and the fault plan is cleared. Deterministic for a given history and seed.
    pub fn crash(&self, mode: Crash) {
        let mut s = self.lock();
        let mut rng = Xorshift::new(match mode {
            Crash::DropUnsynced => 1,
            Crash::TornPrefix(x) | Crash::TornPages(x) => x,
        });
        for c in s.contents.values_mut() {
            let old_len = c.durable.len();
            let mut kept = c.durable.clone();
            if c.volatile.len() > old_len {
                let growth = &c.volatile[old_len..];
                match mode {
                    Crash::DropUnsynced => {}
                    Crash::TornPrefix(_) => {
                        let keep = (rng.next_u64() % (growth.len() as u64 + 1)) as usize;
                        kept.extend_from_slice(&growth[..keep]);
                    }
                    Crash::TornPages(_) => {
                        let mut tail = vec![0u8; growth.len()];
                        let mut end = 0;
                        for (i, page) in growth.chunks(4096).enumerate() {
                            if rng.next_u64().is_multiple_of(2) {
                                tail[i * 4096..i * 4096 + page.len()].copy_from_slice(page);
                                end = i * 4096 + page.len();
                            }
                        }
                        tail.truncate(end);
                        kept.extend_from_slice(&tail);
                    }
                }
                kept = c.without_lost(kept);
            }
            c.durable.clone_from(&kept);
            c.volatile = kept;
            c.lost.clear();
            c.holes.clone_from(&c.durable_holes);
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
        c.holes.clear();
        c.durable_holes.clear();
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
    /// Writes in flight (with [`FaultPlan::defer_writes`]), oldest first.
    deferred: Mutex<Vec<(Arc<WriteBuf>, u64)>>,
}

impl FaultFile {
    fn state(&self) -> io::Result<MutexGuard<'_, State>> {
        let s = self.io.lock();
        if s.generation != self.generation {
            return Err(eio("handle from before a crash"));
        }
        Ok(s)
    }

    /// The state for a change to this file, counted as a mutating operation; refused on a
    /// read-only handle.
    fn mutable_state(&self) -> io::Result<MutexGuard<'_, State>> {
        if !self.writable {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                "read-only handle",
            ));
        }
        let mut s = self.state()?;
        s.op()?;
        Ok(s)
    }
}

impl IoFile for FaultFile {
    fn submit_write(&self, buf: &Arc<WriteBuf>, offset: u64) -> io::Result<bool> {
        if !self.state()?.plan.defer_writes {
            return self.write_buf_at(buf, 0, offset).map(|()| true);
        }
        let mut d = self.deferred.lock().unwrap_or_else(|e| e.into_inner());
        d.push((Arc::clone(buf), offset));
        Ok(false)
    }

    fn complete_writes(&self, in_flight: usize) -> io::Result<Vec<u64>> {
        let mut d = self.deferred.lock().unwrap_or_else(|e| e.into_inner());
        let (mut done, mut failure) = (Vec::new(), None);
        while d.len() > in_flight || (failure.is_some() && !d.is_empty()) {
            let (buf, offset) = d.remove(0);
            match self.write_buf_at(&buf, 0, offset) {
                Ok(()) => done.push(offset),
                Err(e) => {
                    failure.get_or_insert(e);
                }
            }
        }
        match failure {
            Some(e) => Err(e),
            None => Ok(done),
        }
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let mut s = self.state()?;
        if State::matches(s.plan.fail_reads_of.as_ref(), &self.path) {
            return Err(eio("read"));
        }
        if let Some((of, at)) = &s.plan.fail_read_at
            && self.path.to_string_lossy().contains(of.as_str())
            && (offset..offset + buf.len() as u64).contains(at)
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
        let mut s = self.mutable_state()?;
        s.counters.writes += 1;
        let n = s.counters.writes;
        if s.plan.fail_write == Some(n)
            || s.plan.fail_writes_from.is_some_and(|f| n >= f)
            || State::matches(s.plan.fail_writes_of.as_ref(), &self.path)
        {
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
        // Bytes written again after a failed fsync are dirty again: the next good sync makes
        // them durable (what stays lost is what was not rewritten).
        c.rewritten(start, start + len);
        c.filled(start, start + len);
        Ok(len)
    }

    fn sync(&self) -> io::Result<()> {
        let mut s = self.state()?;
        s.op()?;
        s.counters.syncs += 1;
        let failed = s.plan.fail_sync == Some(s.counters.syncs);
        let c = s
            .contents
            .get_mut(&self.id)
            .ok_or_else(|| eio("file vanished"))?;
        if failed {
            // Like Linux: the dirty data is marked clean and will never reach the disk.
            let (a, b) = (c.durable.len(), c.volatile.len());
            if b > a {
                c.lost.push((a, b));
            }
            return Err(eio("fsync"));
        }
        c.durable = c.without_lost(c.volatile.clone());
        c.durable_holes.clone_from(&c.holes);
        Ok(())
    }

    /// Frees the whole 4 KiB pages of the range: they read as zeros at once, and the hole is
    /// durable once the file is synced (until then a crash gives the bytes back).
    fn punch_hole(&self, offset: u64, len: u64) -> io::Result<()> {
        let mut s = self.mutable_state()?;
        if let Some(kind) = s.plan.refuse_punches {
            return Err(io::Error::new(kind, "injected punch refusal"));
        }
        let c = s
            .contents
            .get_mut(&self.id)
            .ok_or_else(|| eio("file vanished"))?;
        let to = |v: u64| usize::try_from(v).map_err(|_| eio("range"));
        let a = to(offset)?.next_multiple_of(4096);
        let b = (to(offset.saturating_add(len))? / 4096 * 4096).min(c.volatile.len());
        if a >= b {
            return Ok(());
        }
        c.volatile[a..b].fill(0);
        c.filled(a, b);
        c.holes.push((a, b));
        Ok(())
    }

    fn holes(&self) -> io::Result<Vec<(u64, u64)>> {
        let s = self.state()?;
        let c = s
            .contents
            .get(&self.id)
            .ok_or_else(|| eio("file vanished"))?;
        let mut h: Vec<(u64, u64)> = c
            .holes
            .iter()
            .map(|&(a, b)| (a as u64, b.min(c.volatile.len()) as u64))
            .filter(|(a, b)| a < b)
            .collect();
        h.sort_unstable();
        let mut merged: Vec<(u64, u64)> = Vec::with_capacity(h.len());
        for (a, b) in h {
            match merged.last_mut() {
                Some(last) if a <= last.1 => last.1 = last.1.max(b),
                _ => merged.push((a, b)),
            }
        }
        Ok(merged)
    }

    fn size(&self) -> io::Result<u64> {
        let s = self.state()?;
        Ok(s.contents
            .get(&self.id)
            .map_or(0, |c| c.volatile.len() as u64))
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        let mut s = self.state()?;
        s.op()?;
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
        if State::matches(s.plan.fail_opens_of.as_ref(), path) {
            return Err(io::Error::other("injected EMFILE: too many open files"));
        }
        let parent = path.parent().unwrap_or(Path::new(""));
        let id = match (s.names.get(path).copied(), mode) {
            (Some(_), OpenMode::CreateNew) => {
                return Err(io::Error::new(io::ErrorKind::AlreadyExists, "exists"));
            }
            (Some(id), _) => id,
            (None, OpenMode::CreateNew) => {
                if !s.dirs.contains(parent) {
                    return Err(not_found("no such directory"));
                }
                s.op()?;
                s.next_id += 1;
                let id = s.next_id;
                s.contents.insert(id, Content::default());
                s.names.insert(path.to_owned(), id);
                id
            }
            (None, _) => return Err(not_found("no such file")),
        };
        Ok(Arc::new(FaultFile {
            io: self.clone(),
            id,
            path: path.to_owned(),
            generation: s.generation,
            writable: mode != OpenMode::Read,
            deferred: Mutex::new(Vec::new()),
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
            return Err(not_found("no such directory"));
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
        s.op()?;
        s.names
            .remove(path)
            .map(|_| ())
            .ok_or_else(|| not_found("no such file"))
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut s = self.lock();
        s.op()?;
        let id = s
            .names
            .remove(from)
            .ok_or_else(|| not_found("no such file"))?;
        s.names.insert(to.to_owned(), id);
        Ok(())
    }

    fn sync_dir(&self, path: &Path) -> io::Result<()> {
        let mut s = self.lock();
        s.op()?;
        s.counters.dir_syncs += 1;
        if s.plan.fail_sync_dir == Some(s.counters.dir_syncs) {
            return Err(eio("fsync directory"));
        }
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
        if let Some(kind) = s.plan.refuse_locks {
            return Err(io::Error::new(kind, "lock refused by the fault plan"));
        }
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
        io.crash(Crash::DropUnsynced);
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

    #[test]
    fn failed_fsync_data_never_becomes_durable() {
        let io = FaultIo::new();
        io.create_dir_all(Path::new("d")).unwrap();
        let f = io.open(Path::new("d/f"), OpenMode::CreateNew).unwrap();
        io.sync_dir(Path::new("d")).unwrap();
        f.write_all_at(b"aaaa", 0).unwrap();
        io.set_plan(FaultPlan {
            fail_sync: Some(1),
            ..Default::default()
        });
        assert!(f.sync().is_err());
        assert_eq!(
            io.read_file(Path::new("d/f")).unwrap(),
            b"aaaa",
            "still readable"
        );
        f.write_all_at(b"bbbb", 4).unwrap();
        f.sync().unwrap(); // a later good sync does not rescue the first write
        io.crash(Crash::DropUnsynced);
        assert_eq!(io.read_file(Path::new("d/f")).unwrap(), b"\0\0\0\0bbbb");
    }

    #[test]
    fn bytes_rewritten_after_a_failed_fsync_are_durable_at_the_next_good_one() {
        let io = FaultIo::new();
        io.create_dir_all(Path::new("d")).unwrap();
        let f = io.open(Path::new("d/f"), OpenMode::CreateNew).unwrap();
        io.sync_dir(Path::new("d")).unwrap();
        f.write_all_at(b"aaaaaaaa", 0).unwrap();
        io.set_plan(FaultPlan {
            fail_sync: Some(1),
            ..Default::default()
        });
        assert!(f.sync().is_err());
        // Written again (as the manifest rewrites a record whose fsync failed), then synced.
        f.write_all_at(b"cc", 2).unwrap();
        f.sync().unwrap();
        io.crash(Crash::DropUnsynced);
        assert_eq!(io.read_file(Path::new("d/f")).unwrap(), b"\0\0cc\0\0\0\0");
    }

    #[test]
    fn torn_pages_keep_a_subset_and_halts_stop_everything() {
        let io = FaultIo::new();
        io.create_dir_all(Path::new("d")).unwrap();
        let f = io.open(Path::new("d/f"), OpenMode::CreateNew).unwrap();
        io.sync_dir(Path::new("d")).unwrap();
        f.write_all_at(&[7u8; 4096 * 8], 0).unwrap();
        io.crash(Crash::TornPages(3));
        let got = io.read_file(Path::new("d/f")).unwrap();
        assert!(got.len() < 4096 * 8 && !got.is_empty());
        assert!(
            got.chunks(4096)
                .all(|p| p.iter().all(|&b| b == 7) || p.iter().all(|&b| b == 0))
        );
        assert!(
            got.chunks(4096).any(|p| p.iter().all(|&b| b == 0)),
            "a hole"
        );
        io.set_plan(FaultPlan {
            halt_after_ops: Some(1),
            ..Default::default()
        });
        let g = io.open(Path::new("d/f"), OpenMode::ReadWrite).unwrap();
        g.write_all_at(b"x", 0).unwrap();
        assert!(g.write_at(b"y", 1).is_err());
        assert!(g.sync().is_err());
        assert!(io.sync_dir(Path::new("d")).is_err());
    }
}
