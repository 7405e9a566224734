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

use crate::framed::FrameBuf;
use crate::ghost::{Ghost, fingerprint};

const SHARDS: usize = 64;

/// One shard of the copies, by key.
type Shard = RwLock<HashMap<StateKey, Arc<Entry>>>;

struct Entry {
    sequence: u64,
    /// The payload: a copy, or the frame buffer the record was written from.
    bytes: Arc<FrameBuf>,
    read: AtomicBool,
}

#[derive(Default)]
struct Queues {
    small: VecDeque<(StateKey, u64, u64)>,
    main: VecDeque<(StateKey, u64, u64)>,
    small_bytes: u64,
    main_bytes: u64,
    ghost: Ghost,
    /// Memory of evicted copies, reused for new ones of the same length: an insert then copies
    /// into pages already faulted in rather than into fresh ones the kernel must zero first.
    /// Oldest first: a new eviction pushes out the oldest, so copies of a length no longer
    /// inserted cannot keep the room from those that are.
    free: VecDeque<FrameBuf>,
    free_bytes: u64,
}

/// Memory of evicted copies kept for reuse, at most this fraction of the budget…
const FREE_FRACTION: u64 = 16;
/// …and at most this many bytes…
const FREE_MAX: u64 = 64 << 20;
/// …of copies at least this long (a smaller allocation comes from memory the allocator keeps).
const FREE_MIN_LEN: u64 = 64 << 10;

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
        Some(f(entry.bytes.payload()))
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

    /// Keeps a copy of `bytes` as the record of `key` at `sequence`, evicting as needed first.
    /// Copies larger than a quarter of the budget are not kept.
    pub(crate) fn insert(&self, key: &StateKey, sequence: u64, bytes: &[u8]) {
        self.keep(key, sequence, bytes.len(), |free| {
            Arc::new(FrameBuf::copy_of(free, bytes))
        });
    }

    /// Keeps the record of `key` at `sequence`, written from `frame`, trading buffers where it
    /// can: when the tier has the memory of an evicted copy of the same length, it keeps `frame`
    /// itself and returns that memory, for the caller's next copy. Otherwise (the tier is still
    /// filling) it keeps a copy and returns `None`: the caller's frame stays the caller's, so
    /// its next copy needs no fresh memory either, and the copy's page faults fall here, not on
    /// the caller's copy. A buffer much larger than its payload is always copied (the tier
    /// counts payload bytes).
    pub(crate) fn take(
        &self,
        key: &StateKey,
        sequence: u64,
        frame: &Arc<FrameBuf>,
    ) -> Option<FrameBuf> {
        let len = frame.payload().len();
        if frame.capacity() > len + len / 8 {
            self.insert(key, sequence, frame.payload());
            return None;
        }
        let mut traded = None;
        self.keep(key, sequence, len, |free| match free {
            Some(memory) => {
                traded = Some(memory);
                Arc::clone(frame)
            }
            None => Arc::new(frame.duplicate()),
        });
        traded
    }

    /// Keeps the copy `make` returns (given the memory of an evicted copy of `len` bytes, where
    /// there is one) as the record of `key` at `sequence`, evicting as needed first. Copies
    /// larger than a quarter of the budget, or older than the one held, are not kept (`make` is
    /// not called).
    fn keep(
        &self,
        key: &StateKey,
        sequence: u64,
        len: usize,
        make: impl FnOnce(Option<FrameBuf>) -> Arc<FrameBuf>,
    ) {
        let n = len as u64;
        if !self.enabled() || n > self.budget / 4 {
            return;
        }
        let newer_held = |this: &Self| {
            this.shard(key)
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .get(key)
                .is_some_and(|e| e.sequence >= sequence)
        };
        if newer_held(self) {
            return;
        }
        let mut q = self.queues.lock().unwrap_or_else(|p| p.into_inner());
        let capacity = (self.budget / n.max(1)) as usize;
        self.evict(&mut q, n, capacity);
        // The memory of an evicted copy of the same length, where there is one.
        let reusable = n >= FREE_MIN_LEN;
        let free = match q
            .free
            .iter()
            .rposition(|b| reusable && b.payload().len() == len)
        {
            Some(i) => {
                q.free_bytes -= n;
                q.free.remove(i)
            }
            None => None,
        };
        {
            let mut map = self.shard(key).write().unwrap_or_else(|p| p.into_inner());
            if map.get(key).is_some_and(|e| e.sequence >= sequence) {
                if let Some(b) = free {
                    q.free_bytes += n;
                    q.free.push_back(b);
                }
                return;
            }
            let entry = Arc::new(Entry {
                sequence,
                bytes: make(free),
                read: AtomicBool::new(false),
            });
            if map.insert(*key, entry).is_none() {
                self.entries.fetch_add(1, Ordering::Relaxed);
            }
        }
        if q.ghost.take(fingerprint(key)) {
            q.main.push_back((*key, sequence, n));
            q.main_bytes += n;
        } else {
            q.small.push_back((*key, sequence, n));
            q.small_bytes += n;
        }
        self.used
            .store(q.small_bytes + q.main_bytes, Ordering::Relaxed);
    }

    /// Evicts (S3-FIFO) until `incoming` more bytes fit the budget; the memory of copies it
    /// drops is kept for reuse, within bounds.
    fn evict(&self, q: &mut Queues, incoming: u64, capacity: usize) {
        let keep_free = (self.budget / FREE_FRACTION).min(FREE_MAX);
        while q.small_bytes + q.main_bytes + incoming > self.budget {
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
                    let gone = if map.get(&k).is_some_and(|e| e.sequence == seq) {
                        self.entries.fetch_sub(1, Ordering::Relaxed);
                        map.remove(&k)
                    } else {
                        None
                    };
                    drop(map);
                    // Its memory, unless a reader or a write in flight still holds it.
                    if let Some(b) = gone
                        .and_then(|e| Arc::try_unwrap(e).ok())
                        .and_then(|e| Arc::try_unwrap(e.bytes).ok())
                        && n >= FREE_MIN_LEN
                        && n <= keep_free
                    {
                        while q.free_bytes + n > keep_free
                            && let Some(old) = q.free.pop_front()
                        {
                            q.free_bytes -= old.payload().len() as u64;
                        }
                        q.free_bytes += n;
                        q.free.push_back(b);
                    }
                    if from_small {
                        q.ghost.remember(fingerprint(&k), capacity);
                    }
                }
                None => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use orbitkv_segments::Alignment;
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
    fn evicted_memory_is_reused_and_every_copy_holds_its_own_bytes() {
        let len = 64 << 10;
        let t = DramTier::new(64 * len as u64);
        let mut out = Vec::new();
        let mut seen = std::collections::HashSet::new();
        let mut reused = 0;
        for i in 0..256u64 {
            let bytes = vec![i as u8; len];
            t.insert(&key(i), i + 1, &bytes);
            assert!(t.get(&key(i), i + 1, &mut out));
            assert_eq!(out, bytes, "copy {i}");
            assert!(t.used_bytes() <= 64 * len as u64);
            let at = t.with(&key(i), i + 1, |b| b.as_ptr() as usize).unwrap();
            if !seen.insert(at) {
                reused += 1;
            }
        }
        // Once the tier is full, each eviction's memory takes the next copy.
        assert!(reused > 100, "{reused} copies reused evicted memory");
    }

    /// A finished frame of `len` payload bytes, all `byte`, in `memory` when given.
    fn frame(len: usize, byte: u8, memory: Option<FrameBuf>) -> Arc<FrameBuf> {
        let mut f = memory.unwrap_or_default();
        let b = f.begin(Alignment::Direct, len);
        b.resize(b.len() + len, 0);
        Arc::new(FrameBuf::framed_test(f, byte))
    }

    #[test]
    fn take_copies_while_filling_and_trades_evicted_memory_once_full() {
        let len = 64 << 10;
        let t = DramTier::new(64 * len as u64);
        let mut out = Vec::new();
        let (mut kept, mut traded) = (0, 0);
        let mut memory = None;
        for i in 0..256u64 {
            let f = frame(len, i as u8, memory.take());
            let at = f.payload().as_ptr() as usize;
            memory = t.take(&key(i), i + 1, &f);
            assert!(t.get(&key(i), i + 1, &mut out));
            assert_eq!(out, vec![i as u8; len], "copy {i}");
            // Trading, the frame itself is kept; filling, a copy.
            let held = t.with(&key(i), i + 1, |b| b.as_ptr() as usize);
            assert_eq!(held == Some(at), memory.is_some(), "copy {i}");
            kept += 1;
            if let Some(m) = &memory {
                assert_eq!(
                    m.payload().len(),
                    len,
                    "memory of a copy of the same length"
                );
                traded += 1;
            }
            assert!(t.used_bytes() <= 64 * len as u64);
        }
        assert_eq!(kept, 256);
        // The first 64 fill the tier; then each evicts a copy whose memory comes back.
        assert!(traded > 150, "{traded} traded");
        // Not kept (an older sequence than the one held).
        let old = frame(len, 9, None);
        assert!(t.take(&key(255), 1, &old).is_none());
        assert!(t.get(&key(255), 256, &mut out));
        assert_eq!(out, vec![255u8; len]);
    }

    #[test]
    fn a_frame_much_larger_than_its_payload_is_copied() {
        let t = DramTier::new(1 << 20);
        let mut big = FrameBuf::default();
        big.begin(Alignment::Direct, 64 << 10);
        let f = frame(1000, 3, Some(big));
        assert!(t.take(&key(1), 1, &f).is_none());
        let held = t
            .with(&key(1), 1, |b| (b.as_ptr() as usize, b.to_vec()))
            .unwrap();
        assert_ne!(held.0, f.payload().as_ptr() as usize, "a copy");
        assert_eq!(held.1, vec![3u8; 1000]);
    }

    #[test]
    fn evicted_memory_of_a_new_length_pushes_out_the_old() {
        // The free list's room (a sixteenth of the budget) filled by copies of one length must
        // not keep copies of another length from trading once those are all that is inserted.
        let (old, new) = (256 << 10, 128 << 10);
        let t = DramTier::new(64 * old as u64);
        for i in 0..256u64 {
            t.insert(&key(i), i + 1, &vec![1u8; old]);
        }
        let mut traded = 0;
        for i in 256..1024u64 {
            if t.take(&key(i), i + 1, &frame(new, 2, None)).is_some() {
                traded += 1;
            }
        }
        assert!(traded > 500, "{traded} of 768 traded");
    }

    #[test]
    fn disabled_holds_nothing() {
        let t = DramTier::new(0);
        t.insert(&key(1), 1, b"x");
        assert!(!t.get(&key(1), 1, &mut Vec::new()));
    }
}
