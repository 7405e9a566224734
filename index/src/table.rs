//! One shard's open-addressing table: linear probing over seqlocked [`Slot`]s; deletions leave
//! tombstones (entries never move while readers may be probing); a shard rebuilds into a new
//! table when live entries plus tombstones pass [`MAX_LOAD`], and the old table is reclaimed
//! through the epoch once no reader can hold it.
//!
//! Slot words: `w0` header (state, tier; seqlock version in the low bits), `w1` class id and
//! range length, `w2`–`w4` the first 24 bytes of the engine's native hash, `w5` record sequence,
//! `w6` segment and offset / 8, `w7` stored length and range start.

use crate::slot::{Slot, WORDS};

/// Highest fraction of occupied (live or tombstone) slots before a rebuild.
pub(crate) const MAX_LOAD: f64 = 0.75;
/// Load a rebuilt table starts at.
pub(crate) const TARGET_LOAD: f64 = 0.55;
/// Smallest table.
pub(crate) const MIN_CAPACITY: usize = 16;

pub(crate) const STATE_LIVE: u64 = 1;
pub(crate) const STATE_TOMBSTONE: u64 = 2;

pub(crate) fn state_of(w0: u64) -> u64 {
    (w0 >> 32) & 0xff
}

/// The key part of a slot: class and 24 bytes of native hash.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SlotKey {
    pub(crate) class: u32,
    pub(crate) native: [u64; 3],
}

/// SplitMix64's finalizer: every input bit reaches every output bit.
fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// A random seed fixed for the life of the process, so the slots keys land in cannot be
/// predicted (and so cannot be crowded onto one probe path) by whoever chooses the hashes.
fn seed() -> u64 {
    use std::hash::BuildHasher;
    static SEED: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *SEED.get_or_init(|| {
        std::collections::hash_map::RandomState::new().hash_one(0x6f72_6269_746bu64)
    })
}

impl SlotKey {
    /// The word the shard is chosen from and the word the position is chosen from: all of the
    /// class and the 24 native-hash bytes mixed under the process's seed. Engines' native
    /// hashes are digests, but a hash is whatever an engine sends: a structured or hostile one
    /// must not pile onto one probe chain.
    pub(crate) fn hashes(&self) -> (u64, u64) {
        let c = u64::from(self.class).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let a = mix(self.native[0] ^ seed() ^ c);
        let b = mix(self.native[1] ^ a.rotate_left(23));
        let h = mix(self.native[2] ^ b);
        (h, mix(h ^ 0xD6E8_FEB8_6659_FD93))
    }
    pub(crate) fn matches(&self, w: &[u64; WORDS]) -> bool {
        (w[1] & 0xffff_ffff) as u32 == self.class && w[2..5] == self.native
    }
}

#[derive(Debug)]
pub(crate) struct Table {
    pub(crate) slots: Box<[Slot]>,
}

/// `hash` mapped onto `0..n` (multiply-shift: any `n`, no modulo).
fn fast_range(hash: u64, n: usize) -> usize {
    ((u128::from(hash) * n as u128) >> 64) as usize
}

impl Table {
    pub(crate) fn with_capacity(cap: usize) -> Self {
        let cap = cap.max(MIN_CAPACITY);
        Self {
            slots: (0..cap).map(|_| Slot::default()).collect(),
        }
    }

    pub(crate) fn capacity(&self) -> usize {
        self.slots.len()
    }

    /// Probe order for `key`: every slot index, starting at its home.
    pub(crate) fn probe(&self, key: &SlotKey) -> impl Iterator<Item = usize> + use<> {
        let n = self.slots.len();
        let home = fast_range(key.hashes().1, n);
        (0..n).map(move |i| (home + i) % n)
    }

    /// Lock-free lookup: the live slot words for `key`, if present.
    pub(crate) fn find(&self, key: &SlotKey) -> Option<[u64; WORDS]> {
        for i in self.probe(key) {
            let slot = &self.slots[i];
            if state_of(slot.header()) == 0 {
                return None;
            }
            let w = slot.read(std::hint::spin_loop);
            match state_of(w[0]) {
                0 => return None,
                STATE_LIVE if key.matches(&w) => return Some(w),
                _ => {}
            }
        }
        None
    }

    /// Writer-side lookup (the shard lock is held): the slot of `key` if live, and the first
    /// free slot (tombstone or empty) on its probe path.
    pub(crate) fn locate(&self, key: &SlotKey) -> (Option<usize>, Option<usize>) {
        let mut free = None;
        for i in self.probe(key) {
            let w = self.slots[i].read(std::hint::spin_loop);
            match state_of(w[0]) {
                0 => return (None, free.or(Some(i))),
                STATE_LIVE if key.matches(&w) => return (Some(i), free),
                STATE_LIVE => {}
                _ => {
                    free.get_or_insert(i);
                }
            }
        }
        (None, free)
    }
}
