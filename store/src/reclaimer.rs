//! The SSD tier's capacity: when the segments would outgrow [`crate::StoreConfig::ssd_bytes`],
//! whole sealed segments are reclaimed (log-structured: no record is ever rewritten in place).
//!
//! The default policy, [`Policy::S3Fifo`], keeps two logs. New bundles go to the probation log,
//! whose segments are reclaimed first once it holds more than a tenth of the budget; a record
//! read while there is copied into the main log when its segment is reclaimed, one reclaimed
//! unread is dropped and remembered by a ghost set, and a bundle whose key the ghost remembers is
//! written straight to the main log. In the main log a record read since it was last written is
//! copied forward once more; the rest are dropped. Copies keep their record sequence, are durable
//! before the reclaimed segment's deletion is committed to the manifest, and the index moves to
//! them only then, so a crash at any point loses no record that was not being evicted and serves
//! none that was superseded or retired. Segments holding pinned records are never reclaimed.
//!
//! Replayed on the shared request trace this beat per-block LRU at 10%, 25% and 50% of the
//! trace's distinct blocks, where a single FIFO log (with or without copying read records
//! forward) lost to LRU at 10% (docs/performance.md has the numbers and the command).

use std::sync::atomic::{AtomicU64, Ordering};

use orbitkv_index::Tier;
use orbitkv_segments::{FrameBody, RecordMeta};
use orbitkv_state::StateKey;
use orbitkv_wal::{ManifestRecord, SegmentState};

use crate::error::{Error, Result};
use crate::ghost::fingerprint;
use crate::segment::{read_entry_payload, read_sealed};
use crate::stats::Stats;
use crate::{StateStore, Writer};

/// Which segments the SSD tier reclaims when it is full.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Policy {
    /// Two logs, probation and main, with a ghost set; records read are copied forward.
    #[default]
    S3Fifo,
    /// One log: the oldest segment is dropped whole.
    Fifo,
    /// One log: the oldest segment is reclaimed, its records read since written copied forward.
    FifoReinsert,
}

impl Policy {
    /// Every policy, by name.
    pub const ALL: [(&'static str, Policy); 3] = [
        ("s3-fifo", Policy::S3Fifo),
        ("fifo", Policy::Fifo),
        ("fifo-reinsert", Policy::FifoReinsert),
    ];

    /// The policy's name.
    pub fn name(self) -> &'static str {
        match self {
            Policy::S3Fifo => "s3-fifo",
            Policy::Fifo => "fifo",
            Policy::FifoReinsert => "fifo-reinsert",
        }
    }

    fn reinserts(self) -> bool {
        self != Policy::Fifo
    }
}

/// Which log a segment belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Log {
    /// New bundles (S3-FIFO only).
    Probation = 0,
    /// Everything else.
    Main = 1,
}

/// One bit per record location — set when the record is read, cleared when it is written — in
/// a fixed table indexed by a hash of (segment, offset). Collisions only make the policy keep a
/// record it could have dropped.
pub(crate) struct ReadBits {
    words: Box<[AtomicU64]>,
    mask: u64,
}

impl ReadBits {
    /// A table sized for a tier of `ssd_bytes` (about a bit per KiB, within 2^16..2^31 bits).
    pub(crate) fn new(ssd_bytes: Option<u64>) -> Self {
        let bits = ssd_bytes.map_or(1 << 16, |b| (b / 1024).clamp(1 << 16, 1 << 31));
        let bits = bits.next_power_of_two();
        Self {
            words: (0..bits / 64).map(|_| AtomicU64::new(0)).collect(),
            mask: bits - 1,
        }
    }

    fn at(&self, segment: u64, offset: u64) -> (usize, u64) {
        let h = (segment.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ offset)
            .wrapping_mul(0xBF58_476D_1CE4_E5B9);
        let bit = (h >> 17) & self.mask;
        ((bit / 64) as usize, 1 << (bit % 64))
    }

    /// Marks the record at (`segment`, `offset`) read.
    pub(crate) fn mark(&self, segment: u64, offset: u64) {
        let (w, b) = self.at(segment, offset);
        if self.words[w].load(Ordering::Relaxed) & b == 0 {
            self.words[w].fetch_or(b, Ordering::Relaxed);
        }
    }

    /// Whether the record at (`segment`, `offset`) was read, clearing the bit.
    pub(crate) fn take(&self, segment: u64, offset: u64) -> bool {
        let (w, b) = self.at(segment, offset);
        self.words[w].fetch_and(!b, Ordering::Relaxed) & b != 0
    }

    /// Clears the bit of a location just written.
    pub(crate) fn clear(&self, segment: u64, offset: u64) {
        let (w, b) = self.at(segment, offset);
        if self.words[w].load(Ordering::Relaxed) & b != 0 {
            self.words[w].fetch_and(!b, Ordering::Relaxed);
        }
    }
}

impl StateStore {
    /// File bytes of every segment, the active ones included.
    pub(crate) fn recount_used(&self, w: &mut Writer) {
        let segs = self.segments.read().unwrap_or_else(|p| p.into_inner());
        w.ssd_used = segs.values().map(|s| s.file.size().unwrap_or(0)).sum();
    }

    /// Reclaims segments until `need` more bytes fit the SSD budget. Fails with
    /// [`Error::CapacityExhausted`] when every reclaimable segment is pinned or active.
    pub(crate) fn make_room(&self, w: &mut Writer, need: u64) -> Result<()> {
        let Some(budget) = self.config.ssd_bytes else {
            return Ok(());
        };
        // Every round drops a segment; copies forward clear their read bits, so this ends.
        let mut rounds = 0usize;
        while w.ssd_used + need > budget {
            rounds += 1;
            let victim = (rounds < 1 << 20)
                .then(|| self.pick_victim(w, budget))
                .flatten();
            let Some(victim) = victim else {
                Stats::add(&self.stats.capacity_refusals, 1);
                return Err(Error::CapacityExhausted {
                    need,
                    used: w.ssd_used,
                    budget,
                });
            };
            self.reclaim(w, victim)?;
            self.recount_used(w);
        }
        Ok(())
    }

    /// The segment to reclaim: sealed, not pinned, oldest first — from the probation log while
    /// it holds more than a tenth of the budget (S3-FIFO), else from the main log.
    fn pick_victim(&self, w: &Writer, budget: u64) -> Option<u64> {
        let pinned = self.pins.pinned_segments();
        let segs = self.segments.read().unwrap_or_else(|p| p.into_inner());
        let candidates: Vec<u64> = w
            .manifest
            .state
            .snapshot
            .segments
            .iter()
            .filter(|(id, st)| {
                matches!(st, SegmentState::Sealed(..))
                    && !pinned.contains(id)
                    && segs.contains_key(id)
            })
            .map(|(id, _)| *id)
            .collect();
        if self.config.policy != Policy::S3Fifo {
            return candidates.first().copied();
        }
        let probation_bytes: u64 = w
            .probation
            .iter()
            .filter_map(|id| segs.get(id))
            .map(|s| s.file.size().unwrap_or(0))
            .sum();
        let oldest_probation = candidates.iter().find(|id| w.probation.contains(id));
        let oldest_main = candidates.iter().find(|id| !w.probation.contains(id));
        let from_probation = probation_bytes > budget / 10 || oldest_main.is_none();
        if from_probation {
            oldest_probation.or(oldest_main).copied()
        } else {
            oldest_main.or(oldest_probation).copied()
        }
    }

    /// Reclaims sealed segment `id`: copies the records the policy keeps into the main log
    /// (synced), moves the index to them, drops the rest, commits the deletion, removes the file.
    fn reclaim(&self, w: &mut Writer, id: u64) -> Result<()> {
        let Some(file) = self
            .segments
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&id)
            .cloned()
        else {
            return Ok(());
        };
        let from_probation = w.probation.contains(&id);
        let entries = match read_sealed(&file) {
            Ok((_, _, footer, _)) => footer.entries,
            Err(why) => {
                // Its records cannot be listed; they are misses once the file is gone.
                tracing::warn!(
                    segment = id,
                    "reclaiming a segment whose footer fails: {why}"
                );
                Vec::new()
            }
        };
        let mut kept: Vec<(StateKey, u64, u64)> = Vec::new(); // key, sequence, new offset
        let mut dropped: Vec<(StateKey, u64)> = Vec::new();
        let mut kept_in: u64 = 0;
        for e in &entries {
            let FrameBody::Record(meta) = &e.body else {
                continue;
            };
            if !self.is_live(&meta.key, id, e.offset, e.record_sequence) {
                continue;
            }
            let keep = self.config.policy.reinserts() && self.read_bits.take(id, e.offset);
            let payload = if keep {
                read_entry_payload(&file, e).ok()
            } else {
                None
            };
            let Some(payload) = payload else {
                dropped.push((meta.key, e.record_sequence));
                continue;
            };
            let rec: [(RecordMeta, &[u8]); 1] = [(meta.clone(), payload.as_slice())];
            let need = self.bundle_need(&rec);
            let seg = self.ensure_active(w, Log::Main, need)?;
            kept_in = seg;
            let Some(active) = w.active[Log::Main as usize].as_mut() else {
                continue;
            };
            let before = active.len;
            let appended = match active.append_with(&rec, |_| e.record_sequence) {
                Ok(a) => a,
                Err(err) => return Err(self.refuse_on(w, err, Log::Main)),
            };
            w.ssd_used += active.len - before;
            if let Some(ne) = appended.first() {
                self.read_bits.clear(seg, ne.offset);
                kept.push((meta.key, e.record_sequence, ne.offset));
            }
        }
        if !kept.is_empty() {
            // The copies are durable before the original's deletion is.
            self.sync_log(w, Log::Main)?;
        }
        let seg32 = u32::try_from(kept_in).unwrap_or_default();
        for (key, seq, offset) in &kept {
            self.index.relocate(key, *seq, Tier::Ssd, seg32, *offset)?;
        }
        let capacity = self.index.len().max(1024);
        for (key, seq) in &dropped {
            if self.index.remove(key, Some(*seq)).is_some() {
                self.dram.remove(key, *seq);
                if from_probation {
                    w.ghost.remember(fingerprint(key), capacity);
                }
            }
        }
        let mseq = w.next_sequence;
        w.manifest
            .append(mseq, ManifestRecord::SegmentDeleted { segment_id: id })?;
        w.next_sequence += 1;
        self.segments
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&id);
        w.probation.remove(&id);
        let _ = self.io.remove_file(&file.path);
        Stats::add(&self.stats.reclaimed_segments, 1);
        Stats::add(&self.stats.evicted_records, dropped.len() as u64);
        Stats::add(&self.stats.reinserted_records, kept.len() as u64);
        tracing::debug!(
            segment = id,
            kept = kept.len(),
            dropped = dropped.len(),
            "reclaimed a segment"
        );
        Ok(())
    }
}
