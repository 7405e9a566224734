//! Copy-forward: one record's verified payload appended anew, for compaction, salvage and
//! reclaim.
//!
//! A copy goes to new output segments (compaction, salvage) or to the main log (reclaim).
//! A copy takes a new sequence, except in salvage, where it keeps its own.
//! The new sequence is taken before the append, so a sequence that may have reached the disk is
//! never given out again.
//! The index moves to a copy only once the copy is committed ([`StateStore::adopt_copy`]).
//! A DRAM copy kept under a sequence the index no longer names is dropped then.

use std::sync::Arc;

use orbitkv_index::{Record, Tier};
use orbitkv_segments::{FRAME_HEADER_LEN, RecordMeta};
use orbitkv_state::StateKey;

use crate::active::{Active, SegmentFile};
use crate::compactor::CompactReport;
use crate::error::Result;
use crate::reclaimer::Log;
use crate::{StateStore, Writer};

/// Where a record is copied forward to.
pub(crate) enum Target<'a> {
    /// Output segments, sealed as they fill (compaction, salvage).
    Outputs {
        /// The output being filled.
        open: &'a mut Option<Active>,
        /// The outputs sealed so far.
        sealed: &'a mut Vec<Arc<SegmentFile>>,
        /// Counts the outputs and their bytes.
        report: &'a mut CompactReport,
    },
    /// The main log's active segment (reclaim). A failed append applies the failure policy.
    MainLog,
}

/// A record copied forward, not yet adopted by the index.
pub(crate) struct Copied {
    /// The record's key.
    pub(crate) key: StateKey,
    /// The sequence of the record copied.
    pub(crate) from: u64,
    /// The copy.
    pub(crate) record: Record,
}

impl StateStore {
    /// Appends `payload` of `meta`, the record of sequence `from`, to `to`: under a new sequence,
    /// or under `from` itself when `keep_sequence`. `None` when the main log has no active segment
    /// to take it.
    pub(crate) fn copy_forward(
        &self,
        w: &mut Writer,
        to: Target<'_>,
        meta: &RecordMeta,
        payload: &[u8],
        from: u64,
        keep_sequence: bool,
    ) -> Result<Option<Copied>> {
        let rec: [(RecordMeta, &[u8]); 1] = [(meta.clone(), payload)];
        let (segment, entries, sequence) = match to {
            Target::Outputs {
                open,
                sealed,
                report,
            } => {
                let need = (payload.len() + FRAME_HEADER_LEN) as u64;
                let o = self.output_with_room(w, open, sealed, report, need)?;
                let sequence = if keep_sequence {
                    from
                } else {
                    w.take_sequence()
                };
                (o.seg.id, o.append_with(&rec, |_| sequence)?, sequence)
            }
            Target::MainLog => {
                let need = self.bundle_need(rec.iter().map(|(_, p)| p.len()));
                let segment = self.ensure_active(w, Log::Main, need)?;
                let sequence = if keep_sequence {
                    from
                } else {
                    w.take_sequence()
                };
                let Some(active) = w.active[Log::Main as usize].as_mut() else {
                    return Ok(None);
                };
                let before = active.len;
                let entries = match active.append_with(&rec, |_| sequence) {
                    Ok(e) => e,
                    Err(err) => return Err(self.refuse_on(w, err, Log::Main)),
                };
                w.ssd_used += active.len - before;
                (segment, entries, sequence)
            }
        };
        Ok(entries.first().map(|e| Copied {
            key: meta.key,
            from,
            record: Record {
                tier: Tier::Ssd,
                segment: u32::try_from(segment).unwrap_or_default(),
                offset: e.offset,
                stored_len: e.stored_len,
                range: meta.range,
                sequence,
                format: meta.format,
            },
        }))
    }

    /// Moves the index to a committed copy, when the record it was copied from is still the
    /// key's current one; returns whether it moved. The DRAM copy of the old sequence is dropped
    /// then: no index entry names it any more (a pinned record is never copied by compaction or
    /// reclaim), so it would only hold DRAM budget; the next read brings the copy back under the
    /// new sequence.
    pub(crate) fn adopt_copy(&self, c: &Copied) -> Result<bool> {
        let r = &c.record;
        let from = self
            .index
            .get(&c.key)
            .filter(|p| p.sequence == c.from && p.tier == Tier::Ssd);
        let moved =
            self.index
                .relocate(&c.key, c.from, r.sequence, Tier::Ssd, r.segment, r.offset)?;
        if moved && c.from != r.sequence {
            self.dram.remove(&c.key, c.from);
        }
        if moved && let Some(p) = from {
            // The copy keeps the record's place in the order.
            self.recency
                .relocate((u64::from(p.segment), p.offset), c.key, r);
        }
        Ok(moved)
    }
}
