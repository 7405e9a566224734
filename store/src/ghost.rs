//! A bounded FIFO set of key fingerprints: the keys a tier recently evicted from its probation
//! queue without their having been read. A key that comes back while remembered skips probation
//! (S3-FIFO's ghost queue).

use std::collections::{HashSet, VecDeque};
use std::hash::{DefaultHasher, Hash, Hasher};

use orbitkv_state::StateKey;

/// A 64-bit fingerprint of `key` (deterministic across runs and processes).
pub(crate) fn fingerprint(key: &StateKey) -> u64 {
    let mut h = DefaultHasher::new();
    key.hash(&mut h);
    h.finish()
}

/// Remembered fingerprints, oldest forgotten first.
#[derive(Debug, Default)]
pub(crate) struct Ghost {
    set: HashSet<u64>,
    order: VecDeque<u64>,
}

impl Ghost {
    /// Remembers `fp`, forgetting the oldest beyond `capacity`.
    pub(crate) fn remember(&mut self, fp: u64, capacity: usize) {
        if self.set.insert(fp) {
            self.order.push_back(fp);
        }
        while self.order.len() > capacity.max(1) {
            if let Some(old) = self.order.pop_front() {
                self.set.remove(&old);
            }
        }
    }

    /// Whether `fp` is remembered; forgets it if so (it is being readmitted).
    pub(crate) fn take(&mut self, fp: u64) -> bool {
        // The order queue keeps the stale fingerprint until it ages out; `set` decides.
        self.set.remove(&fp)
    }

    /// Fingerprints remembered.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.set.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forgets_the_oldest_beyond_capacity() {
        let mut g = Ghost::default();
        for fp in 0..10 {
            g.remember(fp, 4);
        }
        assert_eq!(g.len(), 4);
        assert!(!g.take(5));
        assert!(g.take(6));
        assert!(!g.take(6), "taking forgets");
        assert!(g.take(9));
    }
}
