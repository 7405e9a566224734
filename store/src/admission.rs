//! Adaptive SSD admission ([`crate::Admission::Adaptive`]): while the SSD tier is full, a record
//! put for the first time may wait in a DRAM waiting room instead of being written. It is
//! written when it is read while waiting (at the next put), or when put again while a ghost
//! still remembers its key. Its index entry names the DRAM tier; it is lost on close or crash,
//! as a record never acknowledged durable may be.
//!
//! Holding back pays where first-time records rarely return (they would push out records that
//! do) and costs where they return after leaving the waiting room (a conversation's next
//! turn). Which holds is measured, not assumed: two shadows of the SSD tier's policy, at a
//! sampled share of its budget, see the sampled keys' references, one writing every record and
//! one holding first-time records back. Records are held back only while the holding shadow's
//! hits, decayed over [`SHADOW_WINDOW`] shadow capacities of references, are at least the
//! other's. The rationale and the measurements are in docs/design.md and docs/performance.md.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::hash::Hash;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use orbitkv_state::StateKey;

use crate::framed::FrameBuf;
use crate::ghost::{Ghost, fingerprint};
use orbitkv_segments::{Alignment, FRAME_HEADER_LEN, RecordMeta};

/// Records the shadows aim to hold: keys are sampled at this over the records the SSD budget
/// holds (all of them for a smaller budget).
pub const SHADOW_RECORDS: usize = 4096;
/// The shadows' hits decay over this many shadow capacities of references.
pub const SHADOW_WINDOW: usize = 16;
/// The ghost remembers this many times the records the SSD tier holds.
const GHOST_PER_RECORD: usize = 2;

/// The bytes a record of `payload` bytes takes on a direct segment (as `record-lru` writes
/// them) and, as a frame, in DRAM: every length here is counted so.
fn footprint(payload: u64) -> u64 {
    Alignment::Direct.round_up(FRAME_HEADER_LEN + payload as usize) as u64
}

/// Keys in recency order, each with a length in bytes.
struct Lru<K> {
    tick: u64,
    bytes: u64,
    at: HashMap<K, (u64, u64)>,
    order: BTreeMap<u64, K>,
}

impl<K> Default for Lru<K> {
    fn default() -> Self {
        Self {
            tick: 0,
            bytes: 0,
            at: HashMap::new(),
            order: BTreeMap::new(),
        }
    }
}

impl<K: Hash + Eq + Copy> Lru<K> {
    fn contains(&self, k: &K) -> bool {
        self.at.contains_key(k)
    }

    /// Makes `k` the most recent, `len` bytes long.
    fn touch(&mut self, k: K, len: u64) {
        self.remove(&k);
        self.tick += 1;
        self.at.insert(k, (self.tick, len));
        self.order.insert(self.tick, k);
        self.bytes += len;
    }

    /// Removes `k`; its length, if it was there.
    fn remove(&mut self, k: &K) -> Option<u64> {
        let (tick, len) = self.at.remove(k)?;
        self.order.remove(&tick);
        self.bytes -= len;
        Some(len)
    }

    fn pop_oldest(&mut self) -> Option<K> {
        let (_, k) = self.order.pop_first()?;
        if let Some((_, len)) = self.at.remove(&k) {
            self.bytes -= len;
        }
        Some(k)
    }

    fn len(&self) -> usize {
        self.at.len()
    }
}

/// A shadow of the SSD tier under `record-lru` with admission: fingerprints and lengths only.
struct Shadow {
    capacity: u64,
    ssd: Lru<u64>,
    room_bytes: u64,
    room: Lru<u64>,
    ghost: Ghost,
}

impl Shadow {
    fn new(capacity: u64, room_bytes: u64) -> Self {
        Self {
            capacity,
            ssd: Lru::default(),
            room_bytes,
            room: Lru::default(),
            ghost: Ghost::default(),
        }
    }

    /// One reference to `fp`; whether it hit. With `hold`, a miss while the tier is full waits
    /// in the room unless the ghost remembers it.
    fn reference(&mut self, fp: u64, len: u64, hold: bool) -> bool {
        if self.ssd.contains(&fp) {
            self.ssd.touch(fp, len);
            return true;
        }
        if self.room.remove(&fp).is_some() {
            self.write(fp, len);
            return true;
        }
        let full = self.ssd.bytes + len > self.capacity;
        let remembered = self.ghost.take(fp);
        self.ghost
            .remember(fp, GHOST_PER_RECORD * self.ssd.len().max(1));
        if hold && full && !remembered {
            self.room.touch(fp, len);
            while self.room.bytes > self.room_bytes {
                self.room.pop_oldest();
            }
        } else {
            self.write(fp, len);
        }
        false
    }

    fn write(&mut self, fp: u64, len: u64) {
        self.ssd.touch(fp, len);
        while self.ssd.bytes > self.capacity && self.ssd.pop_oldest().is_some() {}
    }
}

/// Chooses whether to hold first-time records back (see the module's documentation). Public so
/// that the store-free model of `record-lru` (`orbitkv bench matrix --admission-model`) decides
/// as the store does.
pub struct AdmissionChooser {
    /// A key is sampled when its mixed fingerprint's low 32 bits are below this.
    below: u64,
    all: Shadow,
    held: Shadow,
    hits_all: f64,
    hits_held: f64,
    decay: f64,
    seen: u64,
    warm: u64,
}

impl AdmissionChooser {
    /// Shadows for an SSD budget of `budget` bytes and a room of `room` bytes, sampled for
    /// records taking about `record` bytes each.
    pub fn new(budget: u64, room: u64, record: u64) -> Self {
        let records = (budget / record.max(1)).max(1);
        let rate = (SHADOW_RECORDS as f64 / records as f64).min(1.0);
        let shadow_records = ((records as f64 * rate) as u64).max(1);
        let capacity = (budget as f64 * rate) as u64;
        let room = (room as f64 * rate) as u64;
        Self {
            below: (rate * (1u64 << 32) as f64) as u64,
            all: Shadow::new(capacity, room),
            held: Shadow::new(capacity, room),
            hits_all: 0.0,
            hits_held: 0.0,
            decay: 1.0 - 1.0 / (SHADOW_WINDOW as f64 * shadow_records as f64),
            seen: 0,
            warm: shadow_records,
        }
    }

    /// One use of the record whose key has fingerprint `fp`, taking `len` bytes: a put, a
    /// read or a pin.
    pub fn reference(&mut self, fp: u64, len: u64) {
        if !sampled(fp, self.below) {
            return;
        }
        let all = self.all.reference(fp, len, false);
        let held = self.held.reference(fp, len, true);
        self.hits_all = self.hits_all * self.decay + f64::from(u8::from(all));
        self.hits_held = self.hits_held * self.decay + f64::from(u8::from(held));
        self.seen += 1;
    }

    /// Whether first-time records are held back now.
    pub fn holds(&self) -> bool {
        self.seen >= self.warm && self.hits_held >= self.hits_all
    }
}

/// Whether fingerprint `fp` is in a sample of threshold `below`.
fn sampled(fp: u64, below: u64) -> bool {
    mix(fp) & 0xffff_ffff < below
}

/// SplitMix64's finaliser: fingerprints spread over the sample's range.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// A record waiting in DRAM. One the index no longer names (written, put again, retired)
/// stays until the room lets it go, unreachable: reads go through the index or a pin.
pub(crate) struct Waiting {
    pub(crate) meta: RecordMeta,
    pub(crate) sequence: u64,
    pub(crate) payload: Arc<FrameBuf>,
    /// Read while waiting: written at the next put.
    asked: bool,
}

struct Inner {
    budget: u64,
    room_bytes: u64,
    /// The waiting records, and their order (least recent first out).
    waiting: HashMap<StateKey, Waiting>,
    order: Lru<StateKey>,
    /// Keys of records read while waiting.
    asked: HashSet<StateKey>,
    ghost: Ghost,
    /// Made at the first put, when the records' size is first seen.
    chooser: Option<AdmissionChooser>,
}

/// The admission state.
pub(crate) struct Admission {
    /// `None` when admission is off.
    inner: Option<Mutex<Inner>>,
    /// The chooser's sample threshold (0 until it is made), read without the lock: a use of a
    /// key out of the sample takes no lock.
    below: AtomicU64,
}

/// What admission decided for one put.
pub(crate) struct Decision {
    /// Per record: held back.
    pub(crate) hold: Vec<bool>,
    /// Records read while waiting, to write now.
    pub(crate) asked: Vec<Waiting>,
}

impl Admission {
    /// Admission for an SSD budget of `budget` bytes with a waiting room of `room` bytes;
    /// off when `room` is `None` or 0.
    pub(crate) fn new(budget: u64, room: Option<u64>) -> Self {
        let inner = room.filter(|r| *r > 0).map(|room_bytes| {
            Mutex::new(Inner {
                budget,
                room_bytes,
                waiting: HashMap::new(),
                order: Lru::default(),
                asked: HashSet::new(),
                ghost: Ghost::default(),
                chooser: None,
            })
        });
        Self {
            inner,
            below: AtomicU64::new(0),
        }
    }

    fn inner(&self) -> Option<MutexGuard<'_, Inner>> {
        self.inner
            .as_ref()
            .map(|m| m.lock().unwrap_or_else(|p| p.into_inner()))
    }

    pub(crate) fn enabled(&self) -> bool {
        self.inner.is_some()
    }

    /// Notes a use of an SSD record of `key` (`len` payload bytes) for the shadows.
    pub(crate) fn used(&self, key: &StateKey, len: u64) {
        // 0 while admission is off or has no chooser yet: the read path hashes nothing.
        let below = self.below.load(Ordering::Relaxed);
        if below == 0 {
            return;
        }
        let fp = fingerprint(key);
        if !sampled(fp, below) {
            return;
        }
        if let Some(mut inner) = self.inner()
            && let Some(c) = inner.chooser.as_mut()
        {
            c.reference(fp, footprint(len));
        }
    }

    /// Decides which of `records` (keys not stored now, each once in the bundle) wait in DRAM
    /// rather than being written, when the bundle would not fit the SSD budget unevicted
    /// (`full`) and the SSD tier holds `ssd_records`; and takes the records read while waiting,
    /// to be written with them.
    pub(crate) fn decide(
        &self,
        records: &[(RecordMeta, &[u8])],
        eligible: impl Fn(usize) -> bool,
        full: bool,
        ssd_records: usize,
    ) -> Decision {
        let Some(mut inner) = self.inner() else {
            return Decision {
                hold: vec![false; records.len()],
                asked: Vec::new(),
            };
        };
        let inner = &mut *inner;
        if inner.chooser.is_none() {
            let bytes: u64 = records.iter().map(|(_, p)| footprint(p.len() as u64)).sum();
            let mean = (bytes / records.len().max(1) as u64).max(1);
            let c = AdmissionChooser::new(inner.budget, inner.room_bytes, mean);
            self.below.store(c.below, Ordering::Relaxed);
            inner.chooser = Some(c);
        }
        let mut hold = Vec::with_capacity(records.len());
        for (i, (meta, payload)) in records.iter().enumerate() {
            let fp = fingerprint(&meta.key);
            let holds = match inner.chooser.as_mut() {
                Some(c) => {
                    c.reference(fp, footprint(payload.len() as u64));
                    c.holds()
                }
                None => false,
            };
            let remembered = inner.ghost.take(fp);
            inner
                .ghost
                .remember(fp, GHOST_PER_RECORD * ssd_records.max(1));
            hold.push(holds && full && !remembered && eligible(i));
        }
        // The records read stay in the room, unmarked, until the index names them written: a
        // reader meanwhile still finds them.
        let mut asked = Vec::new();
        for key in std::mem::take(&mut inner.asked) {
            if let Some(w) = inner.waiting.get_mut(&key) {
                w.asked = false;
                asked.push(Waiting {
                    meta: w.meta.clone(),
                    sequence: w.sequence,
                    payload: w.payload.clone(),
                    asked: false,
                });
            }
        }
        Decision { hold, asked }
    }

    /// Lets `key`'s record wait; returns the records the room let go to make room, each with
    /// the sequence it was indexed under.
    pub(crate) fn wait(
        &self,
        meta: RecordMeta,
        sequence: u64,
        payload: Arc<FrameBuf>,
    ) -> Vec<(StateKey, u64)> {
        let Some(mut inner) = self.inner() else {
            return Vec::new();
        };
        let inner = &mut *inner;
        let key = meta.key;
        inner
            .order
            .touch(key, footprint(payload.payload().len() as u64));
        inner.waiting.insert(
            key,
            Waiting {
                meta,
                sequence,
                payload,
                asked: false,
            },
        );
        let mut gone = Vec::new();
        while inner.order.bytes > inner.room_bytes {
            let Some(old) = inner.order.pop_oldest() else {
                break;
            };
            inner.asked.remove(&old);
            if let Some(w) = inner.waiting.remove(&old) {
                gone.push((old, w.sequence));
            }
        }
        gone
    }

    /// The waiting payload of `key` at `sequence`, marked read (written at the next put).
    pub(crate) fn read(&self, key: &StateKey, sequence: u64) -> Option<Arc<FrameBuf>> {
        let mut inner = self.inner()?;
        let inner = &mut *inner;
        let w = inner
            .waiting
            .get_mut(key)
            .filter(|w| w.sequence == sequence)?;
        let payload = w.payload.clone();
        if !w.asked {
            w.asked = true;
            inner.asked.insert(*key);
        }
        if let Some(c) = inner.chooser.as_mut() {
            c.reference(fingerprint(key), footprint(payload.payload().len() as u64));
        }
        Some(payload)
    }

    /// Records waiting and the bytes they take (as frames).
    pub(crate) fn waiting(&self) -> (u64, u64) {
        self.inner()
            .map_or((0, 0), |i| (i.order.len() as u64, i.order.bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shadow_holding_back_writes_a_key_only_once_it_returns() {
        // Room for 4 records of 10 bytes, a waiting room of 2.
        let mut s = Shadow::new(40, 20);
        for fp in 0..4 {
            assert!(!s.reference(fp, 10, true), "not full yet: written");
        }
        assert_eq!(s.ssd.len(), 4);
        for fp in 10..14 {
            assert!(!s.reference(fp, 10, true));
        }
        assert_eq!(s.ssd.len(), 4, "full: held back");
        assert!(s.reference(13, 10, true), "a hit in the room");
        assert!(s.ssd.contains(&13), "and written");
        assert!(!s.reference(10, 10, true), "left the room");
        assert!(s.ssd.contains(&10), "the ghost remembered it: written");
    }

    #[test]
    fn the_chooser_holds_back_where_nothing_returns() {
        let mut c = AdmissionChooser::new(1 << 20, 100 << 10, 1 << 10);
        assert_eq!(c.below, 1 << 32, "a small budget is shadowed whole");
        for fp in 0..4_000u64 {
            c.reference(fp, 1 << 10);
        }
        assert!(c.holds(), "one-shot keys: holding back loses nothing");
        // Every key comes back once, after more keys than the room holds: holding back loses.
        let mut c = AdmissionChooser::new(1 << 20, 100 << 10, 1 << 10);
        for round in 0..40u64 {
            for fp in 0..200u64 {
                c.reference(round * 200 + fp, 1 << 10);
            }
            for fp in 0..200u64 {
                c.reference(round * 200 + fp, 1 << 10);
            }
        }
        assert!(!c.holds(), "{} < {}", c.hits_held, c.hits_all);
    }

    #[test]
    fn a_large_budget_is_sampled() {
        let c = AdmissionChooser::new(1 << 40, 1 << 36, 1 << 20);
        let rate = c.below as f64 / (1u64 << 32) as f64;
        assert!((rate - SHADOW_RECORDS as f64 / (1 << 20) as f64).abs() < 1e-6);
        assert_eq!(c.warm, SHADOW_RECORDS as u64);
    }
}
