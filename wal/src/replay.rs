//! Replay: a pure function from the manifest's bytes to (state, valid length, reason for stopping).
//!
//! Records apply in order; a record that contradicts the state before it stops replay. Unlike a
//! segment scan, replay never skips a bad record — dropping one (a retirement, a deletion) could
//! resurrect dead entries — so a bad record stops replay; it is a benign **torn tail** only when
//! no valid record with a later sequence follows it, and otherwise **corruption** that needs an
//! operator (`orbitkv fsck`). Telling the two apart searches forward for a later valid record:
//! linear for damaged bytes; only bytes crafted with valid checksums make it verify many
//! candidates. A damaged first record is a torn tail only where an append could have left it:
//! a log that starts with a checkpoint was written whole (a temporary file, fsync, rename).

use orbitkv_state::Namespace;

use crate::error::{Error, Result};
use crate::record::{
    CHECKPOINT_TYPE, DecodedRecord, ManifestRecord, NamespaceState, RECORD_ALIGN,
    RECORD_HEADER_LEN, RECORD_MAGIC, SegmentState, Snapshot, decode_record, verified_header_type,
};

/// The live metadata a manifest describes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ManifestState {
    /// Namespaces and segments.
    pub snapshot: Snapshot,
    /// The last record sequence applied.
    pub last_sequence: Option<u64>,
}

impl ManifestState {
    /// True when a record of `namespace` with `sequence` is dead by retirement.
    pub fn is_retired(&self, namespace: &Namespace, sequence: u64) -> bool {
        self.snapshot
            .namespaces
            .get(namespace)
            .and_then(|n| n.retired_below)
            .is_some_and(|w| sequence < w)
    }

    /// The checkpoint record for this state.
    pub fn checkpoint(&self) -> ManifestRecord {
        ManifestRecord::Checkpoint(self.snapshot.clone())
    }

    /// Applies one record, or says why it contradicts the state (nothing is changed then).
    pub fn apply(&mut self, sequence: u64, rec: &ManifestRecord, offset: u64) -> Result<()> {
        let invalid = |reason: String| Error::Invalid {
            offset,
            sequence,
            reason,
        };
        if let Some(prev) = self.last_sequence.filter(|&p| sequence <= p) {
            return Err(Error::SequenceNotIncreasing {
                offset,
                previous: prev,
                found: sequence,
            });
        }
        let snap = &mut self.snapshot;
        match rec {
            ManifestRecord::NamespaceRegistered { namespace, info } => {
                match snap.namespaces.get(namespace) {
                    Some(existing) if existing.info != *info => {
                        return Err(invalid(format!(
                            "namespace {namespace} registered again with a different summary"
                        )));
                    }
                    Some(_) => {}
                    None => {
                        snap.namespaces.insert(
                            *namespace,
                            NamespaceState {
                                info: info.clone(),
                                retired_below: None,
                            },
                        );
                    }
                }
            }
            ManifestRecord::NamespaceRetired {
                namespace,
                watermark,
            } => {
                let Some(ns) = snap.namespaces.get_mut(namespace) else {
                    return Err(invalid(format!("retiring unknown namespace {namespace}")));
                };
                if *watermark > sequence {
                    return Err(invalid(format!(
                        "watermark {watermark} is after the retirement itself"
                    )));
                }
                if ns.retired_below.is_some_and(|w| *watermark < w) {
                    return Err(invalid(
                        "a retirement watermark cannot move back".to_owned(),
                    ));
                }
                ns.retired_below = Some(*watermark);
            }
            ManifestRecord::SegmentCreated(c) => {
                if snap.segments.contains_key(&c.segment_id) {
                    return Err(invalid(format!("segment {} created twice", c.segment_id)));
                }
                if snap
                    .last_segment_sequence
                    .is_some_and(|s| c.segment_sequence <= s)
                {
                    return Err(invalid(format!(
                        "segment sequence {} reused",
                        c.segment_sequence
                    )));
                }
                snap.segments.insert(c.segment_id, SegmentState::Active(*c));
                snap.last_segment_sequence = Some(c.segment_sequence);
            }
            ManifestRecord::SegmentSealed(s) => match snap.segments.get(&s.segment_id) {
                Some(SegmentState::Active(c)) => {
                    let c = *c;
                    snap.segments
                        .insert(s.segment_id, SegmentState::Sealed(c, *s));
                }
                Some(SegmentState::Sealed(..)) => {
                    return Err(invalid(format!("segment {} sealed twice", s.segment_id)));
                }
                None => return Err(invalid(format!("sealing unknown segment {}", s.segment_id))),
            },
            ManifestRecord::SegmentDeleted { segment_id } => {
                if snap.segments.remove(segment_id).is_none() {
                    return Err(invalid(format!("deleting unknown segment {segment_id}")));
                }
            }
            ManifestRecord::CompactionCommitted { inputs, outputs } => {
                let sealed =
                    |id: &u64| matches!(snap.segments.get(id), Some(SegmentState::Sealed(..)));
                for id in outputs {
                    if !sealed(id) {
                        return Err(invalid(format!("compaction output {id} is not sealed")));
                    }
                }
                for id in inputs {
                    if outputs.contains(id) || !sealed(id) {
                        return Err(invalid(format!(
                            "compaction input {id} is not a sealed segment outside the outputs"
                        )));
                    }
                }
                let mut all: Vec<u64> = inputs.iter().chain(outputs).copied().collect();
                all.sort_unstable();
                if all.windows(2).any(|w| w[0] == w[1]) {
                    return Err(invalid(
                        "a segment is listed twice in a compaction".to_owned(),
                    ));
                }
                for id in inputs {
                    snap.segments.remove(id);
                }
            }
            ManifestRecord::Checkpoint(s) => {
                if self.last_sequence.is_some() {
                    // Mid-log, a checkpoint restates the state; it may not change it.
                    if s != snap {
                        return Err(invalid(
                            "a checkpoint differs from the state it snapshots".to_owned(),
                        ));
                    }
                } else {
                    check_snapshot(s, sequence).map_err(invalid)?;
                    *snap = s.clone();
                }
            }
        }
        self.last_sequence = Some(sequence);
        Ok(())
    }
}

/// The rules a snapshot must satisfy on its own (a checkpoint that starts a truncated log).
fn check_snapshot(s: &Snapshot, sequence: u64) -> std::result::Result<(), String> {
    let mut seqs = Vec::with_capacity(s.segments.len());
    for (id, st) in &s.segments {
        let (SegmentState::Active(c) | SegmentState::Sealed(c, _)) = st;
        if c.segment_id != *id {
            return Err(format!("segment {id} listed under another id"));
        }
        seqs.push(c.segment_sequence);
    }
    seqs.sort_unstable();
    if seqs.windows(2).any(|w| w[0] == w[1]) {
        return Err("two segments share a segment sequence".to_owned());
    }
    if seqs
        .last()
        .is_some_and(|&m| s.last_segment_sequence.is_none_or(|l| m > l))
    {
        return Err("a segment sequence above the recorded highest".to_owned());
    }
    if let Some((ns, _)) = s
        .namespaces
        .iter()
        .find(|(_, n)| n.retired_below.is_some_and(|w| w > sequence))
    {
        return Err(format!(
            "namespace {ns}: a watermark after the checkpoint itself"
        ));
    }
    Ok(())
}

/// Why replay stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplayStop {
    /// Every byte was a valid record.
    CleanEnd,
    /// The bytes after the last valid record are an incomplete write (or unwritten zeros); the
    /// log is truncated to `valid_len`.
    TornTail {
        /// What they looked like.
        error: Error,
    },
    /// A bad record with a valid later record after it: the manifest is corrupt.
    Corrupt {
        /// What was wrong.
        error: Error,
        /// Where the next valid record starts.
        next_valid_at: u64,
    },
    /// The first record is damaged and cannot be a torn append. Its header names a checkpoint,
    /// which is written whole and renamed into place. Or its whole header is there and damaged.
    /// Truncating the log would forget every segment.
    DamagedStart {
        /// What was wrong.
        error: Error,
    },
    /// A well-formed record contradicts the state before it.
    Invalid {
        /// Why.
        error: Error,
    },
}

/// The result of replaying a manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replay {
    /// The state after the valid prefix.
    pub state: ManifestState,
    /// Length of the valid prefix.
    pub valid_len: u64,
    /// Why replay stopped.
    pub stop: ReplayStop,
    /// Records applied.
    pub records: u64,
}

/// The next offset after `from` holding a valid record with a sequence after `after`.
fn later_valid(bytes: &[u8], from: usize, after: Option<u64>) -> Option<usize> {
    let mut q = from + RECORD_ALIGN;
    while q + 4 <= bytes.len() {
        if bytes[q..q + 4] == RECORD_MAGIC
            && let Ok(DecodedRecord { sequence, .. }) = decode_record(&bytes[q..], q as u64)
            && after.is_none_or(|a| sequence > a)
        {
            return Some(q);
        }
        q += RECORD_ALIGN;
    }
    None
}

/// Whether the bad first record at the start of `rest` may be an append that a crash tore. A
/// crash may keep any prefix of an unsynced append: part of a header, or a whole header that
/// verifies and names a record other than a checkpoint. Zeros are handled before.
fn could_be_torn_append(rest: &[u8]) -> bool {
    if rest.len() < RECORD_HEADER_LEN {
        let n = rest.len().min(RECORD_MAGIC.len());
        return rest[..n] == RECORD_MAGIC[..n];
    }
    verified_header_type(rest).is_some_and(|t| t != CHECKPOINT_TYPE)
}

/// Replays `bytes` from an empty state.
pub fn replay(bytes: &[u8]) -> Replay {
    let mut state = ManifestState::default();
    let mut pos = 0usize;
    let mut records = 0u64;
    let stop = loop {
        if pos >= bytes.len() {
            break ReplayStop::CleanEnd;
        }
        let rest = &bytes[pos..];
        let error = match decode_record(rest, pos as u64) {
            Ok(d) => match state.apply(d.sequence, &d.record, pos as u64) {
                Ok(()) => {
                    pos += d.len;
                    records += 1;
                    continue;
                }
                Err(e @ Error::SequenceNotIncreasing { .. }) => e,
                Err(error) => break ReplayStop::Invalid { error },
            },
            Err(e) => e,
        };
        if rest.iter().all(|&b| b == 0) {
            break ReplayStop::TornTail { error };
        }
        match later_valid(bytes, pos, state.last_sequence) {
            Some(q) => {
                break ReplayStop::Corrupt {
                    error,
                    next_valid_at: q as u64,
                };
            }
            None if pos == 0 && !could_be_torn_append(rest) => {
                break ReplayStop::DamagedStart { error };
            }
            None => break ReplayStop::TornTail { error },
        }
    };
    Replay {
        state,
        valid_len: pos as u64,
        stop,
        records,
    }
}
