//! Pins: a pinned record's bytes stay readable through [`StateStore::get_pinned`] until it is
//! unpinned, whatever happens to its key meanwhile (superseded, evicted from the index) — except
//! retirement: once its namespace is retired above the record's sequence, a pinned read refuses
//! it, from either tier. A pin holds the segment file open and keeps the segment from being
//! reclaimed or compacted, so the bytes it names stay where it names them. The manager's leases
//! are pins.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use orbitkv_index::{Record, Tier};
use orbitkv_state::StateKey;

use crate::active::SegmentFile;
use crate::error::Result;
use crate::framed::FrameBuf;
use crate::stats::Stats;
use crate::{Sink, StateStore};

/// A pin on one record, from [`StateStore::pin`]; release it with [`StateStore::unpin`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Pin(u64);

impl Pin {
    /// The pin's number (unique for the store's lifetime, for logs and leases).
    pub fn id(self) -> u64 {
        self.0
    }
}

struct Pinned {
    key: StateKey,
    record: Record,
    source: Source,
}

/// Where a pinned record's bytes are.
#[derive(Clone)]
enum Source {
    /// In its segment, held open.
    Segment(Arc<SegmentFile>),
    /// Waiting for SSD admission: its payload, held.
    Waiting(Arc<FrameBuf>),
}

/// The pin table.
#[derive(Default)]
pub(crate) struct Pins {
    next: AtomicU64,
    table: Mutex<Table>,
}

#[derive(Default)]
struct Table {
    pins: HashMap<u64, Pinned>,
    per_segment: HashMap<u64, usize>,
}

impl Pins {
    fn table(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Segments holding at least one pinned record.
    pub(crate) fn pinned_segments(&self) -> HashSet<u64> {
        self.table().per_segment.keys().copied().collect()
    }

    /// Whether a record of `segment` is pinned now. A pin looks its record up in the index and
    /// takes it under the table's lock: once a record is out of the index and this says no, no
    /// pin on it can follow.
    pub(crate) fn holds_segment(&self, segment: u64) -> bool {
        self.table().per_segment.contains_key(&segment)
    }

    /// Pins held.
    pub(crate) fn len(&self) -> usize {
        self.table().pins.len()
    }
}

impl StateStore {
    /// Pins the record `key` names now, or `None` if none is stored.
    pub fn pin(&self, key: &StateKey) -> Option<Pin> {
        let mut table = self.pins.table();
        let record = self.index.get(key)?;
        let id = u64::from(record.segment);
        let source = if record.tier == Tier::Dram {
            let Some(frame) = self.admission.read(key, record.sequence) else {
                // It left the waiting room: so does its entry.
                self.index.remove(key, Some(record.sequence));
                return None;
            };
            Source::Waiting(frame)
        } else {
            if self.is_quarantined(id) {
                return None;
            }
            let segment = self.segment_file(id)?;
            *table.per_segment.entry(id).or_default() += 1;
            self.admission.used(key, u64::from(record.stored_len));
            Source::Segment(segment)
        };
        let pin = self.pins.next.fetch_add(1, Ordering::Relaxed);
        table.pins.insert(
            pin,
            Pinned {
                key: *key,
                record,
                source,
            },
        );
        Stats::add(&self.stats.pins, 1);
        // A pin is taken to read the record: a use.
        self.used(&record);
        Some(Pin(pin))
    }

    /// Releases `pin`; false if it was not held.
    pub fn unpin(&self, pin: Pin) -> bool {
        let mut table = self.pins.table();
        let Some(p) = table.pins.remove(&pin.0) else {
            return false;
        };
        if let Source::Segment(_) = p.source {
            let id = u64::from(p.record.segment);
            if let Some(n) = table.per_segment.get_mut(&id) {
                *n -= 1;
                if *n == 0 {
                    table.per_segment.remove(&id);
                }
            }
        }
        true
    }

    /// What `pin` holds (counted as a read), or `None` when it is not held or its namespace
    /// was retired above the record since it was pinned.
    fn pinned(&self, pin: Pin) -> Option<(StateKey, Record, Source)> {
        let table = self.pins.table();
        let p = table.pins.get(&pin.0)?;
        Stats::add(&self.stats.gets, 1);
        if self.is_retired(&p.key.namespace, p.record.sequence) {
            Stats::add(&self.stats.misses, 1);
            return None;
        }
        Some((p.key, p.record, p.source.clone()))
    }

    /// Reads the pinned record into `out`, verified as [`StateStore::get`] verifies. `None` when
    /// the pin is not held, its namespace was retired above it, or its bytes fail verification.
    pub fn get_pinned(&self, pin: Pin, out: &mut Vec<u8>) -> Result<Option<Record>> {
        let Some((key, record, source)) = self.pinned(pin) else {
            return Ok(None);
        };
        let segment = match source {
            Source::Segment(s) => s,
            Source::Waiting(frame) => {
                out.clear();
                out.extend_from_slice(frame.payload());
                Stats::add(&self.stats.dram_hits, 1);
                return Ok(Some(record));
            }
        };
        if self.dram.get(&key, record.sequence, out) {
            Stats::add(&self.stats.dram_hits, 1);
            return Ok(Some(record));
        }
        Ok(self
            .read_verified(&segment, &key, &record, Sink::Buffer(out), false)
            .then_some(record))
    }

    /// Calls `f` with the pinned record's bytes, verified as [`StateStore::get_pinned`] verifies,
    /// copying them at most once: the DRAM tier's copy is lent as it is; otherwise the record is
    /// read into `scratch`. `None` when the pin is not held, its namespace was retired above it,
    /// or the bytes fail verification.
    pub fn with_pinned<R>(
        &self,
        pin: Pin,
        scratch: &mut Vec<u8>,
        f: impl FnOnce(&[u8]) -> R,
    ) -> Result<Option<R>> {
        let Some((key, record, source)) = self.pinned(pin) else {
            return Ok(None);
        };
        let segment = match source {
            Source::Segment(s) => s,
            Source::Waiting(frame) => {
                Stats::add(&self.stats.dram_hits, 1);
                return Ok(Some(f(frame.payload())));
            }
        };
        let mut f = Some(f);
        if let Some(r) = self
            .dram
            .with(&key, record.sequence, |b| f.take().map(|f| f(b)))
        {
            Stats::add(&self.stats.dram_hits, 1);
            return Ok(r);
        }
        if !self.read_verified(&segment, &key, &record, Sink::Buffer(scratch), false) {
            return Ok(None);
        }
        Ok(f.map(|f| f(scratch)))
    }

    /// Copies payload bytes `from..from + dst.len()` of the pinned record, whose payload must
    /// be exactly `len` bytes, into `dst`, verified as [`StateStore::get_pinned`] verifies: out
    /// of the DRAM tier's copy, or read from SSD straight into `dst` (checked chunk by chunk as
    /// the chunks arrive, no buffer between) — what fills a device pool's pinned staging
    /// memory. `false` when the pin is not held, its namespace was retired above it, the payload
    /// is not `len` bytes, the range lies past it, or the bytes fail verification; `dst` then
    /// holds nothing usable.
    pub fn read_pinned_into(
        &self,
        pin: Pin,
        len: usize,
        from: usize,
        dst: &mut [u8],
    ) -> Result<bool> {
        let Some((key, record, source)) = self.pinned(pin) else {
            return Ok(false);
        };
        let copy = |b: &[u8], dst: &mut [u8]| match b.get(from..from.saturating_add(dst.len())) {
            Some(part) if b.len() == len => {
                dst.copy_from_slice(part);
                true
            }
            _ => false,
        };
        let segment = match source {
            Source::Segment(s) => s,
            Source::Waiting(frame) => {
                Stats::add(&self.stats.dram_hits, 1);
                return Ok(copy(frame.payload(), dst));
            }
        };
        let lent = self.dram.with(&key, record.sequence, |b| copy(b, dst));
        if let Some(copied) = lent {
            Stats::add(&self.stats.dram_hits, 1);
            return Ok(copied);
        }
        Ok(self.read_verified(
            &segment,
            &key,
            &record,
            Sink::Part { len, from, dst },
            false,
        ))
    }
}
