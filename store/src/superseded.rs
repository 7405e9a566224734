//! Where superseded records of a key still lie on disk.
//!
//! A put that replaces a key leaves the older record's bytes in its segment until that segment
//! is reclaimed or compacted. Recovery indexes the newest record of each key it finds, so if the
//! newer record's segment were reclaimed first (S3-FIFO reclaims the probation log before the
//! main log), a restart would serve the superseded record again. The reclaimer therefore keeps
//! (copies forward) a record while an older record of its key survives in another segment; this
//! table says when. It is rebuilt by recovery and holds only keys that were put more than once,
//! which a content-addressed cache rarely does.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

use orbitkv_state::StateKey;

#[derive(Default)]
struct Inner {
    by_key: HashMap<StateKey, Vec<u64>>,
    by_segment: HashMap<u64, Vec<StateKey>>,
}

/// Segments holding superseded records, by key.
#[derive(Default)]
pub(crate) struct Superseded {
    inner: Mutex<Inner>,
}

impl Superseded {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// An older record of `key` lies in `segment`.
    pub(crate) fn note(&self, key: &StateKey, segment: u64) {
        let mut t = self.lock();
        let segs = t.by_key.entry(*key).or_default();
        if !segs.contains(&segment) {
            segs.push(segment);
            t.by_segment.entry(segment).or_default().push(*key);
        }
    }

    /// Whether an older record of `key` lies in a segment other than `segment`.
    pub(crate) fn elsewhere(&self, key: &StateKey, segment: u64) -> bool {
        self.lock()
            .by_key
            .get(key)
            .is_some_and(|segs| segs.iter().any(|s| *s != segment))
    }

    /// `segment` was deleted: the records in it are gone.
    pub(crate) fn segment_gone(&self, segment: u64) {
        let mut t = self.lock();
        let Some(keys) = t.by_segment.remove(&segment) else {
            return;
        };
        for k in keys {
            if let Some(segs) = t.by_key.get_mut(&k) {
                segs.retain(|s| *s != segment);
                if segs.is_empty() {
                    t.by_key.remove(&k);
                }
            }
        }
    }

    /// Keys with superseded records on disk.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.lock().by_key.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use orbitkv_state::{CacheGroupId, Component, HashDomain, Namespace, RankSpec};

    fn key(i: u8) -> StateKey {
        StateKey::new(
            Namespace([1; 32]),
            HashDomain::VllmSha256Cbor,
            &[i; 32],
            CacheGroupId(0),
            Component::DenseKv,
            RankSpec::Rank(0),
        )
        .unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn a_key_is_kept_until_every_older_segment_is_gone() {
        let t = Superseded::default();
        t.note(&key(1), 3);
        t.note(&key(1), 5);
        t.note(&key(1), 5);
        t.note(&key(2), 5);
        assert!(t.elsewhere(&key(1), 9));
        assert!(!t.elsewhere(&key(3), 9));
        t.segment_gone(3);
        assert!(t.elsewhere(&key(1), 9));
        // The only older record is in the segment being reclaimed itself.
        assert!(!t.elsewhere(&key(2), 5));
        t.segment_gone(5);
        assert!(!t.elsewhere(&key(1), 9));
        assert_eq!(t.len(), 0);
    }
}
