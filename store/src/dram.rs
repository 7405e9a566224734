//! The DRAM tier: copies of hot records' payloads under a byte budget, kept by S3-FIFO — new
//! copies enter a small probation queue (a tenth of the budget); one read there promotes a copy
//! to the main queue when it reaches the head, and a copy evicted unread is remembered by a ghost
//! set so that, coming back, it goes straight to main; in main a read buys one more round. The
//! policy was chosen by replaying the shared request trace (docs/performance.md).
//!
//! The tier is inclusive: every copy is of a record also on SSD. The store serves a copy only
//! for the record its caller asked by key and sequence — the one the index names now, or the
//! one a pin holds — and never once the record's namespace is retired above it; so retiring,
//! superseding or evicting a record on SSD makes its DRAM copy unreachable to every new read at
//! once. Readers take a shard's read lock and copy; only inserts take the queue lock.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use orbitkv_state::StateKey;

use crate::ghost::{Ghost, fingerprint};

const SHARDS: usize = 64;

/// One shard of the copies, by key.
type Shard = RwLock<HashMap<StateKey, Arc<Entry>>>;

struct Entry {
    sequence: u64,
    bytes: Box<[u8]>,
    read: AtomicBool,
}

#[derive(Default)]
struct Queues {
    small: VecDeque<(StateKey, u64, u64)>,
    main: VecDeque<(StateKey, u64, u64)>,
    small_bytes: u64,
    main_bytes: u64,
    ghost: Ghost,
}

/// The DRAM tier.
pub(crate) struct DramTier {
    budget: u64,
    shards: Box<[Shard]>,
    queues: Mutex<Queues>,
    used: AtomicU64,
    entries: AtomicU64,
}

impl DramTier {
    /// A tier holding at most `budget` payload bytes (0 disables it).
    pub(crate) fn new(budget: u64) -> Self {
        Self {
            budget,
            shards: (0..SHARDS).map(|_| RwLock::new(HashMap::new())).collect(),
            queues: Mutex::new(Queues::default()),
            used: AtomicU64::new(0),
            entries: AtomicU64::new(0),
        }
    }

    fn shard(&self, key: &StateKey) -> &Shard {
        &self.shards[(fingerprint(key) >> 58) as usize % SHARDS]
    }

    /// Whether the tier holds anything at all.
    pub(crate) fn enabled(&self) -> bool {
        self.budget > 0
    }

    /// Payload bytes held (including copies superseded but not yet evicted).
    pub(crate) fn used_bytes(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    /// Copies held.
    pub(crate) fn len(&self) -> u64 {
        self.entries.load(Ordering::Relaxed)
    }

    /// Copies the copy of `key` at `sequence` into `out` (replacing its contents); false when the
    /// tier holds no copy of exactly that record.
    pub(crate) fn get(&self, key: &StateKey, sequence: u64, out: &mut Vec<u8>) -> bool {
        self.with(key, sequence, |bytes| {
            out.clear();
            out.extend_from_slice(bytes);
        })
        .is_some()
    }

    /// Lends the copy of `key` at `sequence` to `f` without copying it (the copy stays alive
    /// while `f` runs even if it is evicted meanwhile); `None` when there is none.
    pub(crate) fn with<R>(
        &self,
        key: &StateKey,
        sequence: u64,
        f: impl FnOnce(&[u8]) -> R,
    ) -> Option<R> {
        if !self.enabled() {
            return None;
        }
        let entry = {
            let map = self.shard(key).read().unwrap_or_else(|p| p.into_inner());
            match map.get(key) {
                Some(e) if e.sequence == sequence => e.clone(),
                _ => return None,
            }
        };
        entry.read.store(true, Ordering::Relaxed);
        Some(f(&entry.bytes))
    }

    /// Forgets the copy of `key` if it is of `sequence` or older.
    pub(crate) fn remove(&self, key: &StateKey, sequence: u64) {
        if !self.enabled() {
            return;
        }
        let mut map = self.shard(key).write().unwrap_or_else(|p| p.into_inner());
        if map.get(key).is_some_and(|e| e.sequence <= sequence) {
            map.remove(key);
            self.entries.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Keeps a copy of `bytes` as the record of `key` at `sequence`, evicting as needed. Copies
    /// larger than a quarter of the budget are not kept.
    pub(crate) fn insert(&self, key: &StateKey, sequence: u64, bytes: &[u8]) {
        let len = bytes.len() as u64;
        if !self.enabled() || len > self.budget / 4 {
            return;
        }
        let mut q = self.queues.lock().unwrap_or_else(|p| p.into_inner());
        {
            let mut map = self.shard(key).write().unwrap_or_else(|p| p.into_inner());
            if map.get(key).is_some_and(|e| e.sequence >= sequence) {
                return;
            }
            let entry = Arc::new(Entry {
                sequence,
                bytes: bytes.into(),
                read: AtomicBool::new(false),
            });
            if map.insert(*key, entry).is_none() {
                self.entries.fetch_add(1, Ordering::Relaxed);
            }
        }
        let capacity = (self.budget / len.max(1)) as usize;
        if q.ghost.take(fingerprint(key)) {
            q.main.push_back((*key, sequence, len));
            q.main_bytes += len;
        } else {
            q.small.push_back((*key, sequence, len));
            q.small_bytes += len;
        }
        while q.small_bytes + q.main_bytes > self.budget {
            let from_small = q.small_bytes > self.budget / 10 || q.main.is_empty();
            let popped = if from_small {
                q.small.pop_front()
            } else {
                q.main.pop_front()
            };
            let Some((k, seq, n)) = popped else {
                break;
            };
            if from_small {
                q.small_bytes -= n;
            } else {
                q.main_bytes -= n;
            }
            let shard = self.shard(&k);
            let read = {
                let map = shard.read().unwrap_or_else(|p| p.into_inner());
                match map.get(&k) {
                    Some(e) if e.sequence == seq => Some(e.read.swap(false, Ordering::Relaxed)),
                    _ => None, // superseded or removed: its queue slot just goes
                }
            };
            match read {
                Some(true) => {
                    q.main.push_back((k, seq, n));
                    q.main_bytes += n;
                }
                Some(false) => {
                    let mut map = shard.write().unwrap_or_else(|p| p.into_inner());
                    if map.get(&k).is_some_and(|e| e.sequence == seq) {
                        map.remove(&k);
                        self.entries.fetch_sub(1, Ordering::Relaxed);
                    }
                    drop(map);
                    if from_small {
                        q.ghost.remember(fingerprint(&k), capacity);
                    }
                }
                None => {}
            }
        }
        self.used
            .store(q.small_bytes + q.main_bytes, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use orbitkv_state::{CacheGroupId, Component, HashDomain, Namespace, RankSpec};

    use super::*;

    fn key(i: u64) -> StateKey {
        let mut native = [0u8; 32];
        native[..8].copy_from_slice(&i.to_le_bytes());
        StateKey::new(
            Namespace([7; 32]),
            HashDomain::SglangSha256,
            &native,
            CacheGroupId(0),
            Component::DenseKv,
            RankSpec::Rank(0),
        )
        .unwrap()
    }

    #[test]
    fn serves_only_the_sequence_it_holds() {
        let t = DramTier::new(1 << 20);
        t.insert(&key(1), 5, b"abc");
        let mut out = Vec::new();
        assert!(t.get(&key(1), 5, &mut out));
        assert_eq!(out, b"abc");
        assert!(!t.get(&key(1), 6, &mut out));
        t.insert(&key(1), 4, b"old");
        assert!(t.get(&key(1), 5, &mut out), "an older copy never replaces");
        t.remove(&key(1), 5);
        assert!(!t.get(&key(1), 5, &mut out));
    }

    #[test]
    fn stays_within_budget_and_keeps_what_is_read() {
        let t = DramTier::new(100 * 1000);
        let mut out = Vec::new();
        t.insert(&key(0), 1, &[0; 1000]);
        for i in 1..1000u64 {
            assert!(
                t.get(&key(0), 1, &mut out),
                "a copy read every round stays ({i})"
            );
            t.insert(&key(i), i + 1, &[1; 1000]);
            assert!(t.used_bytes() <= 100 * 1000);
        }
        assert!(t.len() <= 100);
        assert!(
            !t.get(&key(500), 501, &mut out),
            "unread copies are evicted"
        );
    }

    #[test]
    fn disabled_holds_nothing() {
        let t = DramTier::new(0);
        t.insert(&key(1), 1, b"x");
        assert!(!t.get(&key(1), 1, &mut Vec::new()));
    }
}
