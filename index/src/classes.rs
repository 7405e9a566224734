//! Key classes: every distinct (namespace, hash domain, group, component, rank) — with the one
//! StateFormat its namespace fixes for it — interned to a `u32`, so an index slot names its
//! namespace and format in four bytes. Classes are few (groups × ranks × components per
//! namespace) and added rarely; readers use an immutable, epoch-reclaimed snapshot, lock-free.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Mutex;
use std::sync::atomic::Ordering;

use crossbeam_epoch::{self as epoch, Atomic, Guard, Owned};
use orbitkv_state::{
    CacheGroupId, Component, FormatDigest, HashDomain, Namespace, RankSpec, StateKey,
};

use crate::error::{Error, Result};

/// What a class stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct ClassKey {
    pub(crate) namespace: Namespace,
    pub(crate) domain: HashDomain,
    pub(crate) group: CacheGroupId,
    pub(crate) component: Component,
    pub(crate) rank: RankSpec,
}

impl ClassKey {
    pub(crate) fn of(key: &StateKey) -> Self {
        Self {
            namespace: key.namespace,
            domain: key.hash.domain(),
            group: key.hash.group(),
            component: key.hash.component(),
            rank: key.hash.rank(),
        }
    }
}

/// A class and its format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ClassInfo {
    pub(crate) key: ClassKey,
    pub(crate) format: FormatDigest,
}

/// Hashes a class key by the first bytes of its namespace (already a SHA-256) and its small
/// fields: no SipHash on the read path.
#[derive(Default)]
pub(crate) struct FoldHasher(u64);

impl Hasher for FoldHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8).take(2) {
            let mut b = [0u8; 8];
            b[..chunk.len()].copy_from_slice(chunk);
            self.0 = (self.0 ^ u64::from_le_bytes(b)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }
    fn write_u8(&mut self, v: u8) {
        self.write_u64(u64::from(v));
    }
    fn write_u32(&mut self, v: u32) {
        self.write_u64(u64::from(v));
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0 ^ v)
            .wrapping_mul(0x9e37_79b9_7f4a_7c15)
            .rotate_left(29);
    }
    fn write_usize(&mut self, v: usize) {
        self.write_u64(v as u64);
    }
}

#[derive(Debug, Default, Clone)]
struct Snapshot {
    by_key: HashMap<ClassKey, u32, BuildHasherDefault<FoldHasher>>,
    /// Class `i` is `info[i - 1]` (zero means "no class").
    info: Vec<ClassInfo>,
}

/// The interner.
#[derive(Debug)]
pub(crate) struct Classes {
    current: Atomic<Snapshot>,
    writer: Mutex<()>,
}

/// Largest class id.
pub(crate) const MAX_CLASSES: u32 = u32::MAX - 1;

impl Classes {
    pub(crate) fn new() -> Self {
        Self {
            current: Atomic::new(Snapshot::default()),
            writer: Mutex::new(()),
        }
    }

    fn snapshot<'g>(&self, guard: &'g Guard) -> Option<&'g Snapshot> {
        let s = self.current.load(Ordering::Acquire, guard);
        // SAFETY: `current` always holds a valid snapshot (never null after `new`); a replaced
        // snapshot is destroyed only through `defer_destroy`, after every guard pinned before the
        // swap (including `guard`) is dropped, so the reference cannot outlive the allocation.
        #[expect(unsafe_code, reason = "epoch-protected dereference")]
        unsafe {
            s.as_ref()
        }
    }

    /// The class of `key`, if it exists.
    pub(crate) fn find(&self, key: &ClassKey, guard: &Guard) -> Option<u32> {
        self.snapshot(guard)?.by_key.get(key).copied()
    }

    /// What class `id` stands for.
    pub(crate) fn info(&self, id: u32, guard: &Guard) -> Option<ClassInfo> {
        let s = self.snapshot(guard)?;
        s.info.get((id as usize).checked_sub(1)?).copied()
    }

    /// The class of `key` with `format`, created if new; a different format for an existing class
    /// is refused.
    pub(crate) fn intern(&self, key: ClassKey, format: FormatDigest) -> Result<u32> {
        let guard = epoch::pin();
        let check = |s: &Snapshot| -> Option<Result<u32>> {
            let id = *s.by_key.get(&key)?;
            let info = s.info[id as usize - 1];
            Some(if info.format == format {
                Ok(id)
            } else {
                Err(Error::FormatConflict {
                    namespace: key.namespace,
                    indexed: info.format,
                    found: format,
                })
            })
        };
        if let Some(r) = self.snapshot(&guard).and_then(check) {
            return r;
        }
        let _lock = self.writer.lock().unwrap_or_else(|p| p.into_inner());
        let cur = self.snapshot(&guard).cloned().unwrap_or_default();
        if let Some(r) = check(&cur) {
            return r;
        }
        let id = u32::try_from(cur.info.len() + 1)
            .ok()
            .filter(|&id| id <= MAX_CLASSES)
            .ok_or(Error::TooManyClasses { limit: MAX_CLASSES })?;
        let mut next = cur;
        next.info.push(ClassInfo { key, format });
        next.by_key.insert(key, id);
        let old = self
            .current
            .swap(Owned::new(next), Ordering::AcqRel, &guard);
        // SAFETY: `old` was the published snapshot and is now unreachable for new readers; the
        // epoch defers its destruction until every reader that could hold it has unpinned.
        #[expect(unsafe_code, reason = "epoch-deferred reclamation")]
        unsafe {
            guard.defer_destroy(old);
        }
        Ok(id)
    }

    /// Every class of `namespace`.
    pub(crate) fn of_namespace(&self, namespace: &Namespace) -> Vec<u32> {
        let guard = epoch::pin();
        self.snapshot(&guard)
            .map(|s| {
                s.info
                    .iter()
                    .enumerate()
                    .filter(|(_, i)| i.key.namespace == *namespace)
                    .map(|(n, _)| n as u32 + 1)
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Bytes held by the current snapshot (approximate).
    pub(crate) fn memory_bytes(&self) -> usize {
        let guard = epoch::pin();
        self.snapshot(&guard).map_or(0, |s| {
            s.info.capacity() * size_of::<ClassInfo>()
                + s.by_key.capacity() * (size_of::<ClassKey>() + 8)
        })
    }
}

impl Drop for Classes {
    fn drop(&mut self) {
        // SAFETY: `&mut self` proves no reader holds a reference into the snapshot any more.
        #[expect(unsafe_code, reason = "exclusive access at drop")]
        unsafe {
            let s = self.current.load(Ordering::Relaxed, epoch::unprotected());
            if !s.is_null() {
                drop(s.into_owned());
            }
        }
    }
}
