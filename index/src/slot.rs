//! One index slot: eight 64-bit words behind a seqlock, so readers never wait and never see a
//! torn entry, with no `unsafe`: every access is atomic.
//!
//! Word 0 carries the seqlock version (low 32 bits, odd while a write is in progress) and the
//! slot's state and tier; words 1..8 carry the key and the location (layout in `table.rs`).
//! Protocol (as crossbeam's `SeqLock`, after Boehm, "Can seqlocks get along with programming
//! language memory models?"):
//!
//! - writer (one at a time per slot, serialized by its shard's mutex):
//!   `w0 ← odd (Relaxed); fence(Release); w1..w7 ← data (Relaxed); w0 ← next even + header (Release)`;
//! - reader: `a ← w0 (Acquire); w1..w7 (Relaxed); fence(Acquire); b ← w0 (Relaxed)`; the read is
//!   consistent when `a == b` and `a`'s version is even, else it retries.

#[cfg(loom)]
use loom::sync::atomic::{AtomicU64, Ordering, fence};
#[cfg(not(loom))]
use std::sync::atomic::{AtomicU64, Ordering, fence};

/// Words per slot.
pub const WORDS: usize = 8;

const VERSION_MASK: u64 = 0xffff_ffff;

/// A seqlocked group of [`WORDS`] words, aligned to a cache line so that a probe touches one line.
#[derive(Debug)]
#[repr(align(64))]
pub struct Slot {
    w: [AtomicU64; WORDS],
}

impl Default for Slot {
    fn default() -> Self {
        Self {
            w: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

impl Slot {
    /// A consistent copy of all words (word 0 with its version bits cleared), retrying while a
    /// write is in progress. `spin` is called before each retry.
    pub fn read(&self, mut spin: impl FnMut()) -> [u64; WORDS] {
        loop {
            let a = self.w[0].load(Ordering::Acquire);
            if a & 1 == 0 {
                let mut out = [0u64; WORDS];
                for (o, w) in out.iter_mut().zip(&self.w).skip(1) {
                    *o = w.load(Ordering::Relaxed);
                }
                fence(Ordering::Acquire);
                let b = self.w[0].load(Ordering::Relaxed);
                if a == b {
                    out[0] = a & !VERSION_MASK;
                    return out;
                }
            }
            spin();
        }
    }

    /// Only word 0's header (version bits cleared), for a cheap emptiness check; the caller must
    /// confirm anything else with [`Slot::read`].
    pub fn header(&self) -> u64 {
        self.w[0].load(Ordering::Acquire) & !VERSION_MASK
    }

    /// Writes all words (word 0's low 32 bits are replaced by the version). Callers serialize
    /// writers to one slot.
    pub fn write(&self, words: [u64; WORDS]) {
        let cur = self.w[0].load(Ordering::Relaxed);
        let v = cur & VERSION_MASK;
        let odd = (cur & !VERSION_MASK) | ((v + 1) & VERSION_MASK);
        self.w[0].store(odd, Ordering::Relaxed);
        fence(Ordering::Release);
        for (w, &x) in self.w.iter().zip(&words).skip(1) {
            w.store(x, Ordering::Relaxed);
        }
        let next = (words[0] & !VERSION_MASK) | ((v + 2) & VERSION_MASK);
        self.w[0].store(next, Ordering::Release);
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn write_then_read() {
        let s = Slot::default();
        assert_eq!(s.read(|| {}), [0; WORDS]);
        let words = [7 << 32, 1, 2, 3, 4, 5, 6, 7];
        s.write(words);
        assert_eq!(s.read(|| {}), words);
        assert_eq!(s.header(), 7 << 32);
        s.write([9 << 32, 0, 0, 0, 0, 0, 0, 1]);
        assert_eq!(s.read(|| {}), [9 << 32, 0, 0, 0, 0, 0, 0, 1]);
    }
}
