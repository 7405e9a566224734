//! The record order of [`Policy::RecordLru`](crate::Policy::RecordLru): every record on the SSD tier, least
//! recently used first.
//!
//! A record is used when it is written, copied, or read. Uses take the current tick; a put
//! advances the tick once it is done, so a request's hits and the bundle it then publishes
//! share one tick. Of records of one tick, those deepest in their chain (latest first token)
//! leave first, as a radix tree drops its leaves first: a chain is shortened from its end and
//! never loses its start while its end is kept.
//!
//! Records are named by their location (segment, offset). Locations are never reused, as
//! segment ids are not. Entries whose record is no longer the key's current one (superseded,
//! retired, dropped after a failed read) stay until they are the oldest: then their frames are
//! punched out like any other's.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use orbitkv_index::{Record, Tier};
use orbitkv_segments::FRAME_HEADER_LEN;
use orbitkv_state::StateKey;

/// Where a record lies.
pub(crate) type Location = (u64, u64);

/// When a record was last used: the tick, then the rank among that tick's records (deeper
/// records rank lower and leave first).
type Stamp = (u64, u64);

/// A record as the order holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Entry {
    /// The record's key.
    pub(crate) key: StateKey,
    /// Its sequence.
    pub(crate) sequence: u64,
    /// Its frame's header and stored payload, in bytes (padding not included).
    pub(crate) frame_len: u64,
    stamp: Stamp,
}

/// The oldest record, taken out of the order by [`Recency::pop_oldest`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Victim {
    pub(crate) at: Location,
    pub(crate) entry: Entry,
}

#[derive(Default)]
struct Inner {
    at: HashMap<Location, Entry>,
    order: BTreeSet<(Stamp, Location)>,
    /// Entries per segment.
    per_segment: HashMap<u64, usize>,
}

impl Inner {
    fn remove(&mut self, at: Location) -> Option<Entry> {
        let e = self.at.remove(&at)?;
        self.order.remove(&(e.stamp, at));
        if let Some(n) = self.per_segment.get_mut(&at.0) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.per_segment.remove(&at.0);
            }
        }
        Some(e)
    }

    fn put(&mut self, at: Location, e: Entry) {
        if let Some(old) = self.at.insert(at, e) {
            self.order.remove(&(old.stamp, at));
        } else {
            *self.per_segment.entry(at.0).or_default() += 1;
        }
        self.order.insert((e.stamp, at));
    }
}

/// The order, shared by readers (a use) and the writer (inserts and evictions). Disabled, it
/// holds nothing and every call returns at once.
pub(crate) struct Recency {
    inner: Mutex<Inner>,
    clock: AtomicU64,
    enabled: bool,
}

/// The rank of a record whose tokens start at `depth`: deeper ranks lower.
fn rank(depth: u64) -> u64 {
    u64::MAX - depth
}

impl Recency {
    /// An empty order, kept only when `enabled`.
    pub(crate) fn new(enabled: bool) -> Self {
        Self {
            inner: Mutex::default(),
            clock: AtomicU64::new(0),
            enabled,
        }
    }

    /// Sets the clock to `tick`: above every recovered record's sequence, which recovery gives
    /// them as their ticks.
    pub(crate) fn start_at(&self, tick: u64) {
        self.clock.store(tick, Ordering::Relaxed);
    }

    /// Records in the order.
    pub(crate) fn len(&self) -> usize {
        self.inner().at.len()
    }

    fn inner(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Adds (or replaces) SSD record `rec` of `key`, used now (`tick` `None`) or at `tick`.
    pub(crate) fn insert(&self, key: StateKey, rec: &Record, tick: Option<u64>) {
        if !self.enabled || rec.tier != Tier::Ssd {
            return;
        }
        let tick = tick.unwrap_or_else(|| self.clock.load(Ordering::Relaxed));
        let entry = Entry {
            key,
            sequence: rec.sequence,
            frame_len: (FRAME_HEADER_LEN as u64).saturating_add(u64::from(rec.stored_len)),
            stamp: (tick, rank(rec.range.start())),
        };
        self.inner()
            .put((u64::from(rec.segment), rec.offset), entry);
    }

    /// Marks the record at `at` used now (a read); one not held is left out.
    pub(crate) fn touch(&self, at: Location, depth: u64) {
        if !self.enabled {
            return;
        }
        let stamp = (self.clock.load(Ordering::Relaxed), rank(depth));
        let mut inner = self.inner();
        if let Some(mut e) = inner.at.get(&at).copied() {
            e.stamp = stamp;
            inner.put(at, e);
        }
    }

    /// Ends a tick (after a put).
    pub(crate) fn advance(&self) {
        if self.enabled {
            self.clock.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Moves the record at `from` to its copy `rec` of `key`, keeping when it was last used;
    /// a copy of a record the order does not hold now (taken out for a moment by an eviction)
    /// is added as used now.
    pub(crate) fn relocate(&self, from: Location, key: StateKey, rec: &Record) {
        if !self.enabled {
            return;
        }
        let moved = {
            let mut inner = self.inner();
            inner.remove(from).map(|mut e| {
                e.sequence = rec.sequence;
                inner.put((u64::from(rec.segment), rec.offset), e);
            })
        };
        if moved.is_none() {
            self.insert(key, rec, None);
        }
    }

    /// Drops the record at `at` (its segment is going).
    pub(crate) fn forget(&self, at: Location) {
        if self.enabled {
            self.inner().remove(at);
        }
    }

    /// Drops every record of `segment` (a quarantined segment).
    pub(crate) fn forget_segment(&self, segment: u64) {
        if !self.enabled {
            return;
        }
        let mut inner = self.inner();
        let gone: Vec<Location> = inner
            .at
            .keys()
            .filter(|(s, _)| *s == segment)
            .copied()
            .collect();
        for at in gone {
            inner.remove(at);
        }
    }

    /// Takes the least recently used record out of the order.
    pub(crate) fn pop_oldest(&self) -> Option<Victim> {
        let mut inner = self.inner();
        let (_, at) = inner.order.first().copied()?;
        let entry = inner.remove(at)?;
        Some(Victim { at, entry })
    }

    /// Puts back a victim that could not go, as it was.
    pub(crate) fn restore(&self, v: Victim) {
        if self.enabled {
            self.inner().put(v.at, v.entry);
        }
    }

    /// Records held in `segment`.
    pub(crate) fn held_in(&self, segment: u64) -> usize {
        self.inner().per_segment.get(&segment).copied().unwrap_or(0)
    }
}

/// The file range a frame at `offset`, of `frame_len` bytes, gives back when punched out: its
/// whole 4 KiB pages, and on a direct segment its padding to the next page too (the next frame
/// starts there). `None` when no whole page is the frame's alone.
pub(crate) fn punch_range(offset: u64, frame_len: u64, direct: bool) -> Option<(u64, u64)> {
    const PAGE: u64 = 4096;
    let end = offset.checked_add(frame_len)?;
    let start = offset.checked_next_multiple_of(PAGE)?;
    let end = if direct {
        end.checked_next_multiple_of(PAGE)?
    } else {
        end / PAGE * PAGE
    };
    (start < end).then_some((start, end - start))
}

#[cfg(test)]
mod tests {
    use super::*;
    use orbitkv_state::{FormatDigest, TokenRange};
    use orbitkv_testkit::fixtures::key;

    /// A record at (`segment`, `offset`) of sequence `sequence` whose tokens start at `depth`.
    fn rec(segment: u32, offset: u64, sequence: u64, depth: u64) -> Record {
        Record {
            tier: Tier::Ssd,
            segment,
            offset,
            stored_len: 100,
            range: TokenRange::new(depth, depth + 16).unwrap_or_else(|e| panic!("{e}")),
            sequence,
            format: FormatDigest([0; 32]),
        }
    }

    #[test]
    fn the_least_recently_used_leaves_first_and_a_chain_from_its_end() {
        let r = Recency::new(true);
        // One request's chain of three, written at one tick.
        for (i, depth) in [(1u64, 0u64), (2, 16), (3, 32)] {
            r.insert(key(i), &rec(1, i * 4096, 1, depth), None);
        }
        r.advance();
        // A later request's block.
        r.insert(key(9), &rec(2, 0, 2, 0), None);
        r.advance();
        // The chain's root is read again: it is now the most recent.
        r.touch((1, 4096), 0);
        let order: Vec<StateKey> = std::iter::from_fn(|| r.pop_oldest())
            .map(|v| v.entry.key)
            .collect();
        assert_eq!(order, vec![key(3), key(2), key(9), key(1)]);
        assert_eq!(r.len(), 0);
    }

    #[test]
    fn relocation_keeps_the_use_and_counts_follow_segments() {
        let r = Recency::new(true);
        r.insert(key(1), &rec(1, 0, 5, 0), Some(3));
        r.insert(key(2), &rec(1, 4096, 6, 0), Some(4));
        assert_eq!(r.held_in(1), 2);
        r.relocate((1, 0), key(1), &rec(7, 0, 8, 0));
        assert_eq!((r.held_in(1), r.held_in(7)), (1, 1));
        let v = r.pop_oldest().unwrap();
        assert_eq!((v.at, v.entry.sequence), ((7, 0), 8));
        r.restore(v);
        // A copy of a record taken out of the order comes back as used now.
        r.relocate((5, 0), key(3), &rec(8, 0, 9, 0));
        assert_eq!(r.held_in(8), 1);
        r.forget_segment(8);
        r.forget_segment(7);
        r.forget((1, 4096));
        assert_eq!(r.len(), 0);
        assert_eq!(r.held_in(1), 0);
    }

    #[test]
    fn a_disabled_order_holds_nothing() {
        let r = Recency::new(false);
        r.insert(key(1), &rec(1, 0, 1, 0), None);
        r.touch((1, 0), 0);
        assert!(r.pop_oldest().is_none());
    }

    #[test]
    fn punched_ranges_free_whole_pages_only() {
        // A direct frame gives back its padding too.
        assert_eq!(punch_range(8192, 4096 + 256, true), Some((8192, 8192)));
        // A packed frame gives back the pages it alone covers.
        assert_eq!(punch_range(4000, 70_000, false), Some((4096, 69_632)));
        assert_eq!(punch_range(4000, 5000, false), Some((4096, 4096)));
        assert_eq!(punch_range(4000, 4000, false), None);
        assert_eq!(punch_range(u64::MAX - 10, 100, true), None);
    }
}
