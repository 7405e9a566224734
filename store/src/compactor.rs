//! Compaction: sealed segments are rewritten with only their live records — still indexed at
//! that very location with that sequence; retired, superseded and damaged records are dropped —
//! into new sealed segments, committed by one manifest record before the inputs are deleted.
//! Each copy takes a new record sequence, so the sequences within an output keep increasing;
//! only a key's current record is copied, under the writer's lock, so no newer record is
//! overtaken. A crash before the commit leaves both copies (the same bytes; recovery keeps the
//! copy, whose sequence is newer); after it, only the outputs count.
//!
//! Salvage (`fsck --repair`) differs: its copies keep their sequences, so each input gets
//! outputs of its own.

use std::sync::Arc;

use orbitkv_segments::{FrameBody, SegmentHeader};
use orbitkv_state::StateKey;
use orbitkv_wal::{ManifestRecord, SegmentSealed, SegmentState};

use crate::active::{Active, EntryError, SegmentFile, read_entry_payload, read_sealed};
use crate::error::{Error, Result};
use crate::forward::{Copied, Target};
use crate::io::OpenMode;
use crate::reclaimer::Log;
use crate::recover::{MAX_SEGMENT_FILE_BYTES, is_punched, read_whole};
use crate::{StateStore, Writer};

/// What one sealed segment holds, and how much of it is still live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentStat {
    /// Segment id.
    pub id: u64,
    /// Records and tombstones listed by its footer.
    pub entries: u64,
    /// Records the index still serves from it.
    pub live_records: u64,
    /// Stored payload bytes of all its records not punched out.
    pub stored_bytes: u64,
    /// Stored payload bytes of its live records.
    pub live_bytes: u64,
    /// Tombstones it holds (a segment with tombstones is not compacted by this version).
    pub tombstones: u64,
}

impl SegmentStat {
    /// Live fraction of its stored bytes (1.0 when empty of payload).
    pub fn live_fraction(&self) -> f64 {
        if self.stored_bytes == 0 {
            return if self.live_records == 0 && self.entries > 0 {
                0.0
            } else {
                1.0
            };
        }
        self.live_bytes as f64 / self.stored_bytes as f64
    }
}

/// What a compaction did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CompactReport {
    /// Segments rewritten (and deleted).
    pub inputs: Vec<u64>,
    /// Segments written.
    pub outputs: Vec<u64>,
    /// Live records copied.
    pub copied: u64,
    /// Records dropped as dead (retired, superseded).
    pub dropped_dead: u64,
    /// Records dropped because they failed verification.
    pub dropped_bad: u64,
    /// File bytes of the inputs.
    pub input_bytes: u64,
    /// File bytes of the outputs.
    pub output_bytes: u64,
}

/// The footer digest the manifest's seal record of segment `id` carries, if it is sealed.
pub(crate) fn seal_digest(state: &orbitkv_wal::ManifestState, id: u64) -> Option<[u8; 32]> {
    match state.snapshot.segments.get(&id) {
        Some(SegmentState::Sealed(_, sealed)) => Some(sealed.footer_digest),
        _ => None,
    }
}

impl StateStore {
    pub(crate) fn is_live(&self, key: &StateKey, id: u64, offset: u64, sequence: u64) -> bool {
        self.index.get(key).is_some_and(|r| {
            u64::from(r.segment) == id && r.offset == offset && r.sequence == sequence
        })
    }

    fn sealed_file(&self, w: &Writer, id: u64) -> Option<Arc<SegmentFile>> {
        if !matches!(
            w.manifest.state.snapshot.segments.get(&id),
            Some(SegmentState::Sealed(..))
        ) {
            return None;
        }
        self.segment_file(id)
    }

    /// Every sealed segment with its live fraction (reads footers only).
    pub fn segment_stats(&self) -> Result<Vec<SegmentStat>> {
        let w = self.writer();
        let ids: Vec<u64> = w.manifest.state.snapshot.segments.keys().copied().collect();
        let mut out = Vec::new();
        for id in ids {
            let Some(file) = self.sealed_file(&w, id) else {
                continue;
            };
            let digest = seal_digest(&w.manifest.state, id);
            let Ok((_, _, footer, _)) = read_sealed(&file, digest.as_ref()) else {
                continue;
            };
            let mut st = SegmentStat {
                id,
                entries: footer.entries.len() as u64,
                live_records: 0,
                stored_bytes: 0,
                live_bytes: 0,
                tombstones: 0,
            };
            // A punched record's bytes are gone already: compacting cannot free them again.
            let holes = file.file.holes().unwrap_or_default();
            for e in &footer.entries {
                match &e.body {
                    FrameBody::Record(_) if is_punched(e, &holes) => {}
                    FrameBody::Record(m) => {
                        st.stored_bytes += u64::from(e.stored_len);
                        if self.is_live(&m.key, id, e.offset, e.record_sequence) {
                            st.live_records += 1;
                            st.live_bytes += u64::from(e.stored_len);
                        }
                    }
                    FrameBody::Tombstone { .. } => st.tombstones += 1,
                    FrameBody::Padding => {}
                }
            }
            out.push(st);
        }
        Ok(out)
    }

    /// Live records and their stored bytes per namespace (reads footers only).
    pub fn namespace_usage(&self) -> Result<Vec<(orbitkv_state::Namespace, u64, u64)>> {
        let w = self.writer();
        let ids: Vec<u64> = w.manifest.state.snapshot.segments.keys().copied().collect();
        let mut usage: std::collections::BTreeMap<orbitkv_state::Namespace, (u64, u64)> =
            Default::default();
        for id in ids {
            let Some(file) = self.sealed_file(&w, id) else {
                continue;
            };
            let digest = seal_digest(&w.manifest.state, id);
            let Ok((_, _, footer, _)) = read_sealed(&file, digest.as_ref()) else {
                continue;
            };
            for e in &footer.entries {
                if let FrameBody::Record(m) = &e.body
                    && self.is_live(&m.key, id, e.offset, e.record_sequence)
                {
                    let u = usage.entry(m.key.namespace).or_default();
                    u.0 += 1;
                    u.1 += u64::from(e.stored_len);
                }
            }
        }
        Ok(usage.into_iter().map(|(ns, (n, b))| (ns, n, b)).collect())
    }

    /// Compacts every sealed segment whose live fraction is below `threshold`.
    pub fn compact_below(&self, threshold: f64) -> Result<CompactReport> {
        let ids: Vec<u64> = self
            .segment_stats()?
            .into_iter()
            .filter(|s| s.tombstones == 0 && s.live_fraction() < threshold)
            .map(|s| s.id)
            .collect();
        self.compact(&ids)
    }

    /// The output segment with room for a `need`-byte frame: the current one, or a new one
    /// after sealing the current one when it is full. Each output is listed in `outputs` as it
    /// is created, so a compaction that fails finds every one to delete.
    pub(crate) fn output_with_room<'o>(
        &self,
        w: &mut Writer,
        out: &'o mut Option<Active>,
        outputs: &mut Vec<Arc<SegmentFile>>,
        report: &mut CompactReport,
        need: u64,
    ) -> Result<&'o mut Active> {
        if out.as_ref().is_some_and(|o| {
            !o.entries.is_empty() && o.len + need + o.seal_overhead() > self.config.segment_bytes
        }) && let Some(full) = out.take()
        {
            self.seal_output(w, full, report)?;
        }
        let o = match out.take() {
            Some(o) => o,
            None => {
                let o = self.create_segment(w)?;
                outputs.push(o.seg.clone());
                o
            }
        };
        Ok(out.insert(o))
    }

    fn seal_output(
        &self,
        w: &mut Writer,
        mut out: Active,
        report: &mut CompactReport,
    ) -> Result<()> {
        let (digest, data_end) = out.seal()?;
        w.append_manifest(ManifestRecord::SegmentSealed(SegmentSealed {
            segment_id: out.seg.id,
            footer_digest: digest,
            records: out.entries.len() as u64,
            data_end,
        }))?;
        report.outputs.push(out.seg.id);
        report.output_bytes += self.size_or_known(w, &out.seg);
        Ok(())
    }

    /// Rewrites the sealed segments `ids` (skipping any that are not sealed or hold tombstones)
    /// with only their live records, commits, and deletes them. A compaction that fails before
    /// its commit deletes the outputs it made (`abandon_outputs`).
    pub fn compact(&self, ids: &[u64]) -> Result<CompactReport> {
        tracing::debug!(phase = "compact", step = "begin", segments = ids.len());
        let mut w = self.writer();
        // Copies take new sequences: none may overtake a newer record waiting for its sync.
        self.publish_held_back(&mut w);
        Self::manifest_writable(&w)?;
        let mut outputs: Vec<Arc<SegmentFile>> = Vec::new();
        let mut out: Option<Active> = None;
        let mut committed = false;
        let r = self.compact_locked(&mut w, ids, &mut outputs, &mut out, &mut committed);
        if r.is_err() && !committed {
            self.abandon_outputs(&mut w, outputs, out);
        }
        r
    }

    /// Deletes the outputs of a compaction that failed before its commit, sealed or still open:
    /// left listed in the manifest (outside the segment map), a restart would index their
    /// copies and bring back records reclaimed or retired meanwhile. Best effort: what cannot be
    /// deleted is logged, and stays until the next open indexes it (the same bytes as their
    /// originals, so never a wrong hit).
    fn abandon_outputs(
        &self,
        w: &mut Writer,
        outputs: Vec<Arc<SegmentFile>>,
        open: Option<Active>,
    ) {
        // Every output created is listed, the open one too.
        if let Some(mut o) = open {
            o.drop_pending();
        }
        for (id, path) in outputs.iter().map(|o| (o.id, o.path.clone())) {
            match w.append_manifest(ManifestRecord::SegmentDeleted { segment_id: id }) {
                Ok(_) => {
                    w.probation.remove(&id);
                    self.superseded.segment_gone(id);
                    self.remove_segment_file(&path);
                }
                Err(e) => tracing::error!(
                    segment = id,
                    "cannot delete an output of a failed compaction ({e}); the next open indexes its copies"
                ),
            }
        }
        self.sync_segments_dir();
        self.recount_used(w);
    }

    fn compact_locked(
        &self,
        w: &mut Writer,
        ids: &[u64],
        outputs: &mut Vec<Arc<SegmentFile>>,
        out: &mut Option<Active>,
        committed: &mut bool,
    ) -> Result<CompactReport> {
        let mut report = CompactReport::default();
        let mut moved: Vec<Copied> = Vec::new();
        let mut inputs = Vec::new();
        // Where the inputs' records lie (for the record-lru order).
        let mut input_records: Vec<(u64, u64)> = Vec::new();
        let pinned = self.pins.pinned_segments();
        for &id in ids {
            if pinned.contains(&id) {
                continue; // a pinned record's bytes stay where the pin names them
            }
            if self
                .uncompactable
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .contains(&id)
            {
                continue;
            }
            let Some(file) = self.sealed_file(w, id) else {
                continue;
            };
            let digest = seal_digest(&w.manifest.state, id);
            let (_, _, footer, _) =
                read_sealed(&file, digest.as_ref()).map_err(|reason| Error::Damaged {
                    path: file.path.clone(),
                    reason,
                })?;
            if footer
                .entries
                .iter()
                .any(|e| matches!(e.body, FrameBody::Tombstone { .. }))
                || self.stands_for_evictions(id, &footer.entries)
            {
                continue;
            }
            inputs.push((id, file.clone()));
            input_records.extend(footer.entries.iter().map(|e| (id, e.offset)));
            report.input_bytes += self.size_or_known(w, &file);
            for e in &footer.entries {
                let FrameBody::Record(meta) = &e.body else {
                    continue;
                };
                if !self.is_live(&meta.key, id, e.offset, e.record_sequence) {
                    self.read_marks.take(id, e.offset);
                    report.dropped_dead += 1;
                    continue;
                }
                let payload = read_entry_payload(&file, e);
                let payload = match payload {
                    Ok(p) => p,
                    // The bytes may be sound (a transient error): the compaction stops, its
                    // inputs kept, rather than drop a live record; later ones leave the
                    // segment out until the store is opened again.
                    Err(EntryError::Io(source)) => {
                        self.uncompactable
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .insert(id);
                        return Err(Error::Io {
                            path: file.path.clone(),
                            op: "read",
                            source,
                        });
                    }
                    Err(EntryError::Bad(why)) => {
                        tracing::warn!(
                            segment = id,
                            offset = e.offset,
                            "dropping a bad record: {why}"
                        );
                        self.index.remove(&meta.key, Some(e.record_sequence));
                        report.dropped_bad += 1;
                        continue;
                    }
                };
                // The copy takes a new sequence, so a segment's sequences keep increasing; only
                // the key's current record is copied, so no newer one is overtaken.
                let to = Target::Outputs {
                    open: &mut *out,
                    sealed: &mut *outputs,
                    report: &mut report,
                };
                let copied = self.copy_forward(w, to, meta, &payload, e.record_sequence, false)?;
                moved.extend(copied);
                report.copied += 1;
            }
        }
        if let Some(last) = out.take() {
            self.seal_output(w, last, &mut report)?;
        }
        if inputs.is_empty() {
            tracing::debug!(phase = "compact", step = "end", inputs = 0);
            return Ok(report);
        }
        report.inputs = inputs.iter().map(|(id, _)| *id).collect();
        // The records that made the dropped ones dead must be durable before those go: else a
        // power loss could take both a synced record and its unsynced successor.
        self.sync_log(w, Log::Probation)?;
        self.sync_log(w, Log::Main)?;
        // The inputs' holes go with them: the punches before must be durable.
        self.sync_punches(w)?;
        w.append_manifest(ManifestRecord::CompactionCommitted {
            inputs: report.inputs.clone(),
            outputs: report.outputs.clone(),
        })?;
        *committed = true;
        // Committed: publish the outputs, move the index, then retire the inputs.
        {
            let mut map = self.segments.write().unwrap_or_else(|p| p.into_inner());
            for o in outputs.iter() {
                map.insert(o.id, o.clone());
            }
        }
        for c in &moved {
            let moved_from = self.index.get(&c.key).filter(|r| r.sequence == c.from);
            if self.adopt_copy(c)?
                && let Some(from) = moved_from
                && self.read_marks.take(u64::from(from.segment), from.offset)
            {
                // A record read before compaction is still one read for the reclaimer.
                self.read_marks
                    .mark(u64::from(c.record.segment), c.record.offset);
            }
        }
        {
            let mut map = self.segments.write().unwrap_or_else(|p| p.into_inner());
            for (id, _) in &inputs {
                map.remove(id);
            }
        }
        // The copies took their records' places in the order; the rest leave it.
        for at in input_records {
            self.recency.forget(at);
        }
        for (id, file) in &inputs {
            w.probation.remove(id);
            w.punched.remove(id);
            self.superseded.segment_gone(*id);
            self.remove_segment_file(&file.path);
        }
        self.sync_segments_dir();
        // A file that could not be removed is still counted here.
        self.recount_used(w);
        tracing::info!(
            inputs = ?report.inputs,
            outputs = ?report.outputs,
            copied = report.copied,
            dropped_dead = report.dropped_dead,
            dropped_bad = report.dropped_bad,
            "compaction committed"
        );
        tracing::debug!(
            phase = "compact",
            step = "end",
            inputs = report.inputs.len()
        );
        Ok(report)
    }
}

impl StateStore {
    /// Rewrites segments whose records cannot all be trusted — bad records, or a header, trailer
    /// or footer that does not verify — by scanning their frames: every frame that verifies and
    /// is still the newest, unretired record of its key is copied (keeping its sequence) into new
    /// segments; then the inputs are committed away and deleted. A file that cannot be read
    /// (larger than any segment the store writes, say) gives nothing to copy and is deleted
    /// too; one too large for this machine's memory stops the salvage with an error instead.
    /// Used by `fsck --repair`.
    pub fn salvage(&self, ids: &[u64]) -> Result<CompactReport> {
        tracing::debug!(phase = "salvage", step = "begin", segments = ids.len());
        let mut w = self.writer();
        let mut report = CompactReport::default();
        let mut out: Option<Active> = None;
        let mut outputs: Vec<Arc<SegmentFile>> = Vec::new();
        let mut placed: Vec<Copied> = Vec::new();
        let mut inputs = Vec::new();
        for &id in ids {
            let Some(SegmentState::Sealed(created, _)) =
                w.manifest.state.snapshot.segments.get(&id).cloned()
            else {
                continue;
            };
            inputs.push(id);
            let path = self.layout.segment(id);
            let bytes = match self
                .io
                .open(&path, OpenMode::Read)
                .and_then(|f| read_whole(f.as_ref(), MAX_SEGMENT_FILE_BYTES))
            {
                Ok(b) => b,
                // A file this machine cannot hold in memory is not known to be damaged: stop
                // rather than delete it.
                Err(e) if e.kind() == std::io::ErrorKind::OutOfMemory => {
                    return Err(crate::error::io_err(&path, "read")(e));
                }
                Err(e) => {
                    tracing::warn!(
                        path = %path.display(),
                        "nothing to salvage from an unreadable segment ({e}); it is deleted"
                    );
                    continue;
                }
            };
            report.input_bytes += bytes.len() as u64;
            // The manifest says what the header holds: a damaged header loses no frame, and one
            // naming another segment lets none of that segment's frames in (their segment
            // sequence differs).
            let header = crate::recover::header_of(&created, &self.directory_id);
            match SegmentHeader::decode(&bytes) {
                Ok(h)
                    if h.segment_id == header.segment_id
                        && h.sequence == header.sequence
                        && h.directory_id == header.directory_id => {}
                found => tracing::warn!(
                    segment = id,
                    "salvaging under the manifest's header; the file's {}",
                    match found {
                        Ok(_) => "names another segment".to_owned(),
                        Err(e) => format!("is damaged ({e})"),
                    }
                ),
            }
            for item in orbitkv_segments::Scanner::new(
                &bytes,
                header,
                orbitkv_segments::ScanMode::TolerateTail,
            ) {
                let orbitkv_segments::ScanItem::Frame(f) = item else {
                    report.dropped_bad += 1;
                    continue;
                };
                let FrameBody::Record(meta) = &f.header.body else {
                    continue;
                };
                let seq = f.header.record_sequence;
                let retired = w.manifest.state.is_retired(&meta.key.namespace, seq);
                let wanted = !retired
                    && self.index.get(&meta.key).is_none_or(|r| {
                        (u64::from(r.segment) == id && r.sequence == seq) || r.sequence < seq
                    });
                if !wanted {
                    report.dropped_dead += 1;
                    continue;
                }
                let Ok(payload) = f.header.payload(&bytes[f.payload.clone()], f.offset) else {
                    report.dropped_bad += 1;
                    continue;
                };
                let to = Target::Outputs {
                    open: &mut out,
                    sealed: &mut outputs,
                    report: &mut report,
                };
                placed.extend(self.copy_forward(&mut w, to, meta, &payload, seq, true)?);
                report.copied += 1;
            }
            // Copies keep their sequences, which increase within one input only: each input
            // gets outputs of its own.
            if let Some(full) = out.take() {
                self.seal_output(&mut w, full, &mut report)?;
            }
        }
        if let Some(last) = out.take() {
            self.seal_output(&mut w, last, &mut report)?;
        }
        if inputs.is_empty() {
            tracing::debug!(phase = "salvage", step = "end", inputs = 0);
            return Ok(report);
        }
        report.inputs = inputs.clone();
        self.sync_punches(&mut w)?;
        w.append_manifest(ManifestRecord::CompactionCommitted {
            inputs: inputs.clone(),
            outputs: report.outputs.clone(),
        })?;
        {
            let mut map = self.segments.write().unwrap_or_else(|p| p.into_inner());
            for o in &outputs {
                map.insert(o.id, o.clone());
            }
        }
        for c in &placed {
            // The copy replaces the record it came from (same sequence) or an older one.
            if !self.adopt_copy(c)? {
                self.index.insert(&c.key, c.record)?;
                self.recency.insert(c.key, &c.record, None);
            }
        }
        {
            let mut map = self.segments.write().unwrap_or_else(|p| p.into_inner());
            let mut q = self.quarantined.write().unwrap_or_else(|p| p.into_inner());
            for id in &inputs {
                map.remove(id);
                q.remove(id);
            }
        }
        for id in &inputs {
            w.punched.remove(id);
            self.recency.forget_segment(*id);
            self.superseded.segment_gone(*id);
            self.remove_segment_file(&self.layout.segment(*id));
        }
        self.sync_segments_dir();
        tracing::debug!(phase = "salvage", step = "end", inputs = inputs.len());
        Ok(report)
    }
}
