//! OrbitKV's in-DRAM index: [`StateKey`] → where the record lives, for tens of millions of
//! entries.
//!
//! - **Lock-free reads.** 64 shards, each an open-addressing table of 64-byte seqlocked slots
//!   (`slot.rs`): a reader never takes a lock, never waits behind a writer, and never sees a torn
//!   entry. Writers serialize per shard. A table that fills up is rebuilt and swapped; the old
//!   one is reclaimed through crossbeam-epoch once no reader can still hold it.
//! - **Compact.** A slot holds a 4-byte key class (namespace, hash domain, group, component,
//!   rank — with the one format the namespace fixes for them — interned in `classes.rs`), the
//!   first 24 bytes of the engine's native hash (all 16 of an xxh3-128 hash), the record sequence
//!   and the location: 64 bytes, about 87–96 bytes per entry at the tables' load. Two keys of one
//!   class whose first 192 (xxh3: 128) hash bits agree would share a slot: an insert of one would
//!   replace the other, and a probe could report the other present. For SHA-256 and xxh3 hashes
//!   that takes about 2^96 (2^64) keys; and because the store verifies the full key stored in
//!   every frame on read, it would still cost only misses, never a wrong hit.
//! - **Newer wins.** Inserting an older record sequence over a newer one keeps the newer.

mod classes;
pub mod error;
pub mod slot;
mod table;

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use crossbeam_epoch::{self as epoch, Atomic, Guard, Owned};
use orbitkv_state::{FormatDigest, Namespace, StateKey, TokenRange};

use crate::classes::{ClassKey, Classes};
pub use crate::error::{Error, Result};
use crate::slot::WORDS;
use crate::table::{MAX_LOAD, STATE_LIVE, STATE_TOMBSTONE, SlotKey, TARGET_LOAD, Table, state_of};

/// Number of shards (a power of two; the top bits of a key's hash choose one).
pub const SHARDS: usize = 64;
/// Largest segment offset an entry holds (offsets are stored in 8-byte units).
pub const MAX_OFFSET: u64 = (u32::MAX as u64) * 8;

/// Where a record's bytes are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Tier {
    /// In the DRAM tier.
    Dram,
    /// In a segment on SSD.
    Ssd,
}

impl Tier {
    fn code(self) -> u64 {
        match self {
            Tier::Dram => 1,
            Tier::Ssd => 2,
        }
    }
    fn from_code(c: u64) -> Self {
        if c == 1 { Tier::Dram } else { Tier::Ssd }
    }
}

/// What the index knows of one record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Record {
    /// Tier.
    pub tier: Tier,
    /// Segment id (SSD) or slab id (DRAM).
    pub segment: u32,
    /// Offset of the frame in its segment (a multiple of 8, at most [`MAX_OFFSET`]).
    pub offset: u64,
    /// The frame's stored payload length.
    pub stored_len: u32,
    /// Tokens covered (start and length below 2^32).
    pub range: TokenRange,
    /// Record sequence (newer wins).
    pub sequence: u64,
    /// StateFormat digest (the same for every record of a namespace, group and rank).
    pub format: FormatDigest,
}

/// What an insert did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Insert {
    /// The key was new.
    Inserted,
    /// An older record of the key was replaced.
    Replaced {
        /// The record replaced.
        previous: Record,
    },
    /// The indexed record is at least as new; it was kept.
    Kept {
        /// The record kept.
        current: Record,
    },
}

#[derive(Debug, Default)]
struct ShardState {
    live: usize,
    tombstones: usize,
}

#[derive(Debug)]
struct Shard {
    table: Atomic<Table>,
    state: Mutex<ShardState>,
}

/// The concurrent index. Share it by reference or `Arc`; all methods take `&self`.
#[derive(Debug)]
pub struct Index {
    shards: Box<[Shard]>,
    classes: Classes,
    len: AtomicUsize,
}

impl Default for Index {
    fn default() -> Self {
        Self::new()
    }
}

fn native_words(key: &StateKey) -> [u64; 3] {
    let mut b = [0u8; 24];
    let n = key.hash.native();
    let take = n.len().min(24);
    b[..take].copy_from_slice(&n[..take]);
    let w = |i: usize| {
        let mut x = [0u8; 8];
        x.copy_from_slice(&b[i * 8..i * 8 + 8]);
        u64::from_le_bytes(x)
    };
    [w(0), w(1), w(2)]
}

fn encode(key: &SlotKey, r: &Record) -> Result<[u64; WORDS]> {
    let limit32 = u64::from(u32::MAX);
    if r.offset > MAX_OFFSET || !r.offset.is_multiple_of(8) {
        return Err(Error::OutOfRange {
            what: "segment offset (a multiple of 8)",
            value: r.offset,
            limit: MAX_OFFSET,
        });
    }
    for (what, v) in [
        ("token range start", r.range.start()),
        ("token range length", r.range.len()),
    ] {
        if v > limit32 {
            return Err(Error::OutOfRange {
                what,
                value: v,
                limit: limit32,
            });
        }
    }
    Ok([
        (STATE_LIVE << 32) | (r.tier.code() << 40),
        u64::from(key.class) | (r.range.len() << 32),
        key.native[0],
        key.native[1],
        key.native[2],
        r.sequence,
        u64::from(r.segment) | ((r.offset / 8) << 32),
        u64::from(r.stored_len) | (r.range.start() << 32),
    ])
}

fn decode(w: &[u64; WORDS], format: FormatDigest) -> Option<Record> {
    let start = w[7] >> 32;
    let range = TokenRange::new(start, start + (w[1] >> 32)).ok()?;
    Some(Record {
        tier: Tier::from_code((w[0] >> 40) & 0xff),
        segment: (w[6] & 0xffff_ffff) as u32,
        offset: (w[6] >> 32) * 8,
        stored_len: (w[7] & 0xffff_ffff) as u32,
        range,
        sequence: w[5],
        format,
    })
}

impl Index {
    /// An empty index.
    pub fn new() -> Self {
        Self::with_capacity(0)
    }

    /// An index sized for `entries` without a rebuild (the store passes what its capacity can
    /// hold).
    pub fn with_capacity(entries: usize) -> Self {
        // Shards fill unevenly (binomially): size each for the mean plus four standard
        // deviations, so that no shard rebuilds before `entries` are in.
        let mean = entries as f64 / SHARDS as f64;
        let per_shard = ((mean + 4.0 * mean.sqrt()) / MAX_LOAD).ceil() as usize;
        Self {
            shards: (0..SHARDS)
                .map(|_| Shard {
                    table: Atomic::new(Table::with_capacity(per_shard)),
                    state: Mutex::new(ShardState::default()),
                })
                .collect(),
            classes: Classes::new(),
            len: AtomicUsize::new(0),
        }
    }

    fn shard_of(&self, k: &SlotKey) -> &Shard {
        &self.shards[(k.hashes().0 >> (64 - SHARDS.trailing_zeros())) as usize]
    }

    fn table<'g>(shard: &Shard, guard: &'g Guard) -> Option<&'g Table> {
        let t = shard.table.load(Ordering::Acquire, guard);
        // SAFETY: a shard always holds a valid table; a replaced table is destroyed only through
        // `defer_destroy` after every guard pinned before the swap (including `guard`) is gone.
        #[expect(unsafe_code, reason = "epoch-protected dereference")]
        unsafe {
            t.as_ref()
        }
    }

    fn slot_key(&self, key: &StateKey, guard: &Guard) -> Option<SlotKey> {
        let class = self.classes.find(&ClassKey::of(key), guard)?;
        Some(SlotKey {
            class,
            native: native_words(key),
        })
    }

    /// The record of `key`, if indexed. Lock-free.
    pub fn get(&self, key: &StateKey) -> Option<Record> {
        let guard = epoch::pin();
        let k = self.slot_key(key, &guard)?;
        let w = Self::table(self.shard_of(&k), &guard)?.find(&k)?;
        let info = self.classes.info(k.class, &guard)?;
        decode(&w, info.format)
    }

    /// True when `key` is indexed. Lock-free.
    pub fn contains(&self, key: &StateKey) -> bool {
        let guard = epoch::pin();
        self.slot_key(key, &guard).is_some_and(|k| {
            Self::table(self.shard_of(&k), &guard).is_some_and(|t| t.find(&k).is_some())
        })
    }

    /// How many keys of `chain`, from the first, are indexed without a gap (one call, one pin).
    pub fn probe(&self, chain: &[StateKey]) -> usize {
        let guard = epoch::pin();
        chain
            .iter()
            .take_while(|key| {
                self.slot_key(key, &guard).is_some_and(|k| {
                    Self::table(self.shard_of(&k), &guard).is_some_and(|t| t.find(&k).is_some())
                })
            })
            .count()
    }

    /// Checks that `record` can be indexed under `key` — interning its class (a different format
    /// for the same namespace, group and rank is refused) and range-checking its fields — without
    /// inserting it, so a caller can refuse a whole batch before writing any of it.
    pub fn prepare(&self, key: &StateKey, record: &Record) -> Result<()> {
        let class = self.classes.intern(ClassKey::of(key), record.format)?;
        encode(
            &SlotKey {
                class,
                native: native_words(key),
            },
            record,
        )
        .map(|_| ())
    }

    /// Inserts or replaces the record of `key`; an older sequence never replaces a newer one.
    pub fn insert(&self, key: &StateKey, record: Record) -> Result<Insert> {
        let class = self.classes.intern(ClassKey::of(key), record.format)?;
        let k = SlotKey {
            class,
            native: native_words(key),
        };
        let words = encode(&k, &record)?;
        let shard = self.shard_of(&k);
        let mut st = shard.state.lock().unwrap_or_else(|p| p.into_inner());
        let guard = epoch::pin();
        let Some(mut table) = Self::table(shard, &guard) else {
            return Ok(Insert::Kept { current: record });
        };
        let (found, mut free) = table.locate(&k);
        if let Some(i) = found {
            let w = table.slots[i].read(std::hint::spin_loop);
            let current = decode(&w, record.format).unwrap_or(record);
            if current.sequence >= record.sequence {
                return Ok(Insert::Kept { current });
            }
            table.slots[i].write(words);
            return Ok(Insert::Replaced { previous: current });
        }
        if free.is_none()
            || (st.live + st.tombstones + 1) as f64 > MAX_LOAD * table.capacity() as f64
        {
            let live = st.live + 1;
            table = Self::rebuild(shard, &mut st, live, &guard);
            free = table.locate(&k).1;
        }
        let Some(i) = free else {
            return Ok(Insert::Kept { current: record });
        };
        if state_of(table.slots[i].header()) == STATE_TOMBSTONE {
            st.tombstones -= 1;
        }
        table.slots[i].write(words);
        st.live += 1;
        self.len.fetch_add(1, Ordering::Relaxed);
        Ok(Insert::Inserted)
    }

    /// Rebuilds `shard` into a table sized for `live` entries at [`TARGET_LOAD`], dropping
    /// tombstones, and publishes it. The shard lock is held.
    fn rebuild<'g>(shard: &Shard, st: &mut ShardState, live: usize, guard: &'g Guard) -> &'g Table {
        let old = shard.table.load(Ordering::Acquire, guard);
        let cap = (live as f64 / TARGET_LOAD).ceil() as usize;
        let next = Table::with_capacity(cap);
        // SAFETY: as in `table`: the current table stays valid while `guard` is pinned.
        #[expect(unsafe_code, reason = "epoch-protected dereference")]
        if let Some(old_table) = unsafe { old.as_ref() } {
            for slot in old_table.slots.iter() {
                let w = slot.read(std::hint::spin_loop);
                if state_of(w[0]) == STATE_LIVE {
                    let k = SlotKey {
                        class: (w[1] & 0xffff_ffff) as u32,
                        native: [w[2], w[3], w[4]],
                    };
                    if let (None, Some(i)) = next.locate(&k) {
                        next.slots[i].write(w);
                    }
                }
            }
        }
        st.tombstones = 0;
        let next = Owned::new(next).into_shared(guard);
        let old = shard.table.swap(next, Ordering::AcqRel, guard);
        // SAFETY: `old` is unreachable for new readers once `next` is published; the epoch
        // destroys it only after every reader pinned before the swap has unpinned. `next` was
        // just published and can only be replaced under the shard lock, which is held for the
        // caller's use of the reference (bounded by `guard`'s lifetime).
        #[expect(unsafe_code, reason = "epoch-deferred reclamation and dereference")]
        unsafe {
            guard.defer_destroy(old);
            next.deref()
        }
    }

    /// Moves the record of `key` to a new location carrying `new_sequence`, if its indexed
    /// record still has `sequence` (a copy must not overwrite a newer record). Returns whether it
    /// moved.
    pub fn relocate(
        &self,
        key: &StateKey,
        sequence: u64,
        new_sequence: u64,
        tier: Tier,
        segment: u32,
        offset: u64,
    ) -> Result<bool> {
        let guard = epoch::pin();
        let Some(k) = self.slot_key(key, &guard) else {
            return Ok(false);
        };
        let Some(info) = self.classes.info(k.class, &guard) else {
            return Ok(false);
        };
        let shard = self.shard_of(&k);
        let _st = shard.state.lock().unwrap_or_else(|p| p.into_inner());
        let Some(table) = Self::table(shard, &guard) else {
            return Ok(false);
        };
        let Some(i) = table.locate(&k).0 else {
            return Ok(false);
        };
        let w = table.slots[i].read(std::hint::spin_loop);
        let Some(mut rec) = decode(&w, info.format) else {
            return Ok(false);
        };
        if rec.sequence != sequence {
            return Ok(false);
        }
        rec.tier = tier;
        rec.segment = segment;
        rec.offset = offset;
        rec.sequence = new_sequence;
        table.slots[i].write(encode(&k, &rec)?);
        Ok(true)
    }

    /// Removes `key` (only if its record has `sequence`, when given); returns what was removed.
    pub fn remove(&self, key: &StateKey, sequence: Option<u64>) -> Option<Record> {
        let guard = epoch::pin();
        let k = self.slot_key(key, &guard)?;
        let info = self.classes.info(k.class, &guard)?;
        let shard = self.shard_of(&k);
        let mut st = shard.state.lock().unwrap_or_else(|p| p.into_inner());
        let table = Self::table(shard, &guard)?;
        let i = table.locate(&k).0?;
        let w = table.slots[i].read(std::hint::spin_loop);
        let rec = decode(&w, info.format)?;
        if sequence.is_some_and(|s| s != rec.sequence) {
            return None;
        }
        let mut t = w;
        t[0] = STATE_TOMBSTONE << 32;
        table.slots[i].write(t);
        st.live -= 1;
        st.tombstones += 1;
        self.len.fetch_sub(1, Ordering::Relaxed);
        Some(rec)
    }

    /// Removes every record of `namespace` with a sequence below `watermark` (a retired
    /// namespace); records at or above it stay. Returns how many were removed.
    pub fn retire(&self, namespace: &Namespace, watermark: u64) -> usize {
        let classes = self.classes.of_namespace(namespace);
        if classes.is_empty() {
            return 0;
        }
        let guard = epoch::pin();
        let mut removed = 0;
        for shard in self.shards.iter() {
            let mut st = shard.state.lock().unwrap_or_else(|p| p.into_inner());
            let Some(table) = Self::table(shard, &guard) else {
                continue;
            };
            for slot in table.slots.iter() {
                let w = slot.read(std::hint::spin_loop);
                let class = (w[1] & 0xffff_ffff) as u32;
                if state_of(w[0]) == STATE_LIVE && w[5] < watermark && classes.contains(&class) {
                    let mut t = w;
                    t[0] = STATE_TOMBSTONE << 32;
                    slot.write(t);
                    st.live -= 1;
                    st.tombstones += 1;
                    removed += 1;
                }
            }
        }
        self.len.fetch_sub(removed, Ordering::Relaxed);
        removed
    }

    /// Number of indexed records.
    pub fn len(&self) -> usize {
        self.len.load(Ordering::Relaxed)
    }

    /// True when nothing is indexed.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// DRAM held by the tables and the class interner, in bytes.
    pub fn memory_bytes(&self) -> usize {
        let guard = epoch::pin();
        let tables: usize = self
            .shards
            .iter()
            .filter_map(|s| Self::table(s, &guard))
            .map(|t| t.capacity() * size_of::<slot::Slot>())
            .sum();
        tables + self.classes.memory_bytes() + size_of::<Self>()
    }
}

impl Drop for Index {
    fn drop(&mut self) {
        for shard in self.shards.iter() {
            // SAFETY: `&mut self` proves no reader holds a reference into any table.
            #[expect(unsafe_code, reason = "exclusive access at drop")]
            unsafe {
                let t = shard.table.load(Ordering::Relaxed, epoch::unprotected());
                if !t.is_null() {
                    drop(t.into_owned());
                }
            }
        }
    }
}
