//! The write path: puts, their placement in a log, segment creation and sealing, syncs, and
//! the failure policy.
//!
//! A put appends its bundle as one write to the active segment of its log.
//! With [`Durability::EveryPut`] a record is indexed only once it is durable.
//! With [`Durability::Group`] records are held back until a sync or seal makes them durable.
//! A failed write or fsync loses the records since the last good sync and seals the segment off.
//! No space does the same and refuses puts for [`NO_SPACE_RETRY`]; durable records stay served.
//! This file is over 500 lines: the put path and its failure policy are reviewed together.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use orbitkv_index::{Insert, Record, Tier};
use orbitkv_segments::{
    Alignment, Compression, FRAME_HEADER_LEN, IndexEntry, RecordMeta, SEGMENT_HEADER_LEN,
    SegmentHeader,
};
use orbitkv_state::StateKey;
use orbitkv_wal::{ManifestRecord, SegmentCreated, SegmentSealed};

use crate::active::{Active, Encoded, Gathered, SegmentFile};
use crate::error::{Error, Result, WriteRefusal, io_err};
use crate::framed::FrameBuf;
use crate::ghost::fingerprint;
use crate::io::OpenMode;
use crate::open::now_ms;
use crate::reclaimer::{Log, Policy};
use crate::stats::Stats;
use crate::{Durability, MAX_BUNDLE_BYTES, MAX_MANIFEST_BYTES, NO_SPACE_RETRY, StateStore, Writer};

/// A bundle made ready for [`StateStore::put_frames`] without the writer's lock: encoded from
/// its payloads ([`StateStore::prepare`]) or its frames gathered into one write buffer
/// ([`StateStore::gather`]).
pub struct Prepared {
    ready: Ready,
    records: usize,
}

/// How a [`Prepared`] bundle was made ready.
enum Ready {
    Encoded(Encoded),
    Gathered(Gathered),
}

/// Takes `records`' frames, each beside its key, shared (for the DRAM tier).
fn keyed(records: &mut Vec<(RecordMeta, FrameBuf)>) -> Vec<(StateKey, Arc<FrameBuf>)> {
    records
        .drain(..)
        .map(|(m, f)| (m.key, Arc::new(f)))
        .collect()
}

/// What [`StateStore::put_frames`] did, record by record.
#[derive(Debug)]
pub struct FramesPut {
    /// The bundle's receipt.
    pub receipt: PutReceipt,
    /// Per record, in order: memory for the caller's next copies, where there is some.
    pub memory: Vec<Option<FrameBuf>>,
    /// Per record, in order: whether it waits in DRAM for SSD admission (readable, not
    /// durable) rather than being written.
    pub held: Vec<bool>,
}

/// What a put did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PutReceipt {
    /// Sequence of the bundle's first record (of the first written, where some were).
    pub first_sequence: u64,
    /// Records of the bundle, written or held.
    pub records: usize,
    /// Whether the records written are durable now.
    pub durable: bool,
    /// Records that wait in DRAM instead of being written ([`crate::Admission`]): readable,
    /// never durable. They take sequences of their own, after the written records'.
    pub held: usize,
}

/// Refuses records of a namespace not registered.
fn registered<'a>(w: &Writer, metas: impl Iterator<Item = &'a RecordMeta>) -> Result<()> {
    for meta in metas {
        let namespaces = &w.manifest.state.snapshot.namespaces;
        if !namespaces.contains_key(&meta.key.namespace) {
            return Err(Error::UnknownNamespace(meta.key.namespace));
        }
    }
    Ok(())
}

/// The index entry of a record waiting in DRAM for SSD admission.
fn waiting_record(meta: &RecordMeta, payload: &[u8], sequence: u64) -> Record {
    Record {
        tier: Tier::Dram,
        segment: 0,
        offset: 0,
        stored_len: u32::try_from(payload.len()).unwrap_or(u32::MAX),
        range: meta.range,
        sequence,
        format: meta.format,
    }
}

/// Refuses a bundle with a payload or a total past the limits.
fn check_sizes(records: &[(RecordMeta, &[u8])]) -> Result<()> {
    let mut total = 0u64;
    for (_, payload) in records {
        if payload.len() > orbitkv_segments::MAX_PAYLOAD_LEN {
            return Err(Error::BadBundle(format!(
                "a payload of {} bytes exceeds {}",
                payload.len(),
                orbitkv_segments::MAX_PAYLOAD_LEN
            )));
        }
        total += payload.len() as u64;
    }
    if total > MAX_BUNDLE_BYTES {
        return Err(Error::BadBundle(format!(
            "a bundle of {total} bytes exceeds {MAX_BUNDLE_BYTES}"
        )));
    }
    Ok(())
}

impl StateStore {
    /// A new segment (for `log`'s appends, or for compaction output): the manifest names it
    /// durably before the file exists; the file is the spare when one is kept (crate::spare),
    /// else a new one; blocks for a whole segment are reserved up front (released past the end
    /// when it is sealed; a disk too full for that still takes appends until it is truly full);
    /// its header is written and synced. A segment's id is its segment sequence, so ids are
    /// never reused.
    pub(crate) fn create_segment(&self, w: &mut Writer) -> Result<Active> {
        let seq = w
            .manifest
            .state
            .snapshot
            .last_segment_sequence
            .map_or(1, |s| s.saturating_add(1));
        let id = seq;
        if u32::try_from(id).is_err() {
            return Err(Error::WritesRefused(WriteRefusal::SegmentIdsExhausted));
        }
        let created = SegmentCreated {
            segment_id: id,
            segment_sequence: seq,
            direct: self.config.alignment == Alignment::Direct,
            compression: self.config.compression != Compression::None,
        };
        w.append_manifest(ManifestRecord::SegmentCreated(created))?;
        let path = self.layout.segment(id);
        let made = self.make_segment(w, id, seq, created.compression, &path);
        if made.is_err() {
            // Listed but never started: delisted and removed, so a put retried on a full disk
            // leaves no empty segment behind each time (the next open removes what is left).
            if let Err(e) = w.append_manifest(ManifestRecord::SegmentDeleted { segment_id: id }) {
                tracing::warn!(segment = id, "a segment not started stays listed: {e}");
            } else if self.io.exists(&path)
                && let Err(e) = self.io.remove_file(&path)
            {
                tracing::warn!(segment = id, "a segment not started stays on disk: {e}");
            }
        }
        made
    }

    /// Makes segment `id`'s file (over the spare when there is one), writes its header and syncs.
    fn make_segment(
        &self,
        w: &mut Writer,
        id: u64,
        seq: u64,
        compression: bool,
        path: &Path,
    ) -> Result<Active> {
        let path = path.to_path_buf();
        let header = SegmentHeader {
            segment_id: id,
            sequence: seq,
            created_unix_ms: now_ms(),
            directory_id: self.directory_id,
            alignment: self.config.alignment,
            compression,
        };
        let mut active = if let Some((file, size)) = self.take_spare(w, &header, &path) {
            let reserved = if file.preallocate(self.config.segment_bytes).is_ok() {
                size.max(self.config.segment_bytes)
            } else {
                size
            };
            let seg = Arc::new(SegmentFile::new(id, path, file));
            Active::over_spare(header, seg, self.config.compression, size, reserved)
        } else {
            let file = self
                .io
                .open(&path, OpenMode::CreateNew)
                .map_err(io_err(&path, "create segment"))?;
            let preallocated = file.preallocate(self.config.segment_bytes).is_ok();
            let seg = Arc::new(SegmentFile::new(id, path, file));
            let mut active = Active::create(header, seg, self.config.compression)?;
            active.preallocated = preallocated;
            if preallocated {
                active.reserved = self.config.segment_bytes;
            }
            active
        };
        active.sync()?;
        self.io
            .sync_dir(&self.layout.segments())
            .map_err(io_err(&self.layout.segments(), "fsync directory"))?;
        Ok(active)
    }

    /// Starts a new active segment of `log` ([`StateStore::create_segment`]).
    fn start_segment(&self, w: &mut Writer, log: Log) -> Result<u64> {
        let active = self.create_segment(w)?;
        let (id, seg) = (active.seg.id, active.seg.clone());
        self.segments
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id, seg);
        w.ssd_used += active.len;
        if log == Log::Probation {
            w.probation.insert(id);
        }
        w.active[log as usize] = Some(active);
        Ok(id)
    }

    /// Seals the active segment of `log` (footer, trailer, sync, manifest record). A failure
    /// while sealing applies the fsync policy to it; a failed checkpoint refuses further writes.
    pub(crate) fn seal_active(&self, w: &mut Writer, log: Log) -> Result<()> {
        let Some(active) = w.active[log as usize].as_mut() else {
            return Ok(());
        };
        tracing::debug!(phase = "seal", step = "begin", segment = active.seg.id);
        let before = active.len;
        let (digest, data_end) = match active.seal() {
            Ok(x) => x,
            Err(e) => {
                self.lose_unsynced(w, log);
                return Err(e);
            }
        };
        let id = active.seg.id;
        let records = active.entries.len() as u64;
        // Durable now: records held back until then become readable.
        self.index_staged(active);
        let after = match active.seg.file.size() {
            Ok(n) => n,
            Err(e) => {
                Stats::add(&self.stats.failed_stats, 1);
                tracing::warn!(
                    path = %active.seg.path.display(),
                    "cannot read a sealed segment's size ({e}); counting its largest footer"
                );
                before + active.seal_overhead()
            }
        };
        w.ssd_used += after.saturating_sub(before);
        w.active[log as usize] = None;
        w.append_manifest(ManifestRecord::SegmentSealed(SegmentSealed {
            segment_id: id,
            footer_digest: digest,
            records,
            data_end,
        }))?;
        if w.manifest.wants_checkpoint(self.config.checkpoint_every) {
            let seq = w.take_sequence();
            match w.manifest.checkpoint(self.io.as_ref(), seq) {
                Ok(()) => {}
                // The manifest is as it was: appends go on, and a later seal tries again,
                // while the manifest stays well short of what an open reads.
                Err(f) if !f.replaced && w.manifest.len() < MAX_MANIFEST_BYTES / 2 => {
                    tracing::warn!("manifest checkpoint failed, tried again later: {}", f.error);
                }
                Err(f) => {
                    tracing::error!("manifest checkpoint failed, refusing writes: {}", f.error);
                    w.refuse = Some(WriteRefusal::CheckpointFailed {
                        detail: f.error.to_string(),
                    });
                    return Err(f.error);
                }
            }
        }
        tracing::debug!(phase = "seal", step = "end", segment = id);
        Ok(())
    }

    /// A failed write or sync on `log`'s active segment: the records since its last good sync
    /// are lost (the records they replaced in the index come back); the segment is sealed off,
    /// truncated to its durable end as far as the device allows.
    fn lose_unsynced(&self, w: &mut Writer, log: Log) {
        let Some(mut active) = w.active[log as usize].take() else {
            return;
        };
        for (key, seq, previous) in active.unsynced.iter().rev() {
            if self.index.remove(key, Some(*seq)).is_some() {
                self.dram.remove(key, *seq);
                if let Some(p) = previous {
                    let _ = self.index.insert(key, *p);
                }
            }
        }
        // Records held back until durable were never readable: their copies go.
        for (key, rec) in active.staged.drain(..) {
            self.dram.remove(&key, rec.sequence);
        }
        // Frames in the write-behind tail or in flight are lost with the rest (in-flight writes
        // are waited for first, so none lands after the truncation below).
        active.drop_pending();
        let lost = active.entries.len() - active.unsynced_from;
        Stats::add(&self.stats.lost_records, lost as u64);
        // A put that synced itself reported its own loss; others learn of it from `sync`.
        if self.config.durability != Durability::EveryPut {
            w.lost_since_sync += lost as u64;
        }
        // Best effort: the segment takes no more appends either way, and the recount below
        // counts whatever length it kept.
        if let Err(e) = active
            .seg
            .file
            .set_len(active.synced_len.max(SEGMENT_HEADER_LEN as u64))
        {
            tracing::warn!(
                path = %active.seg.path.display(),
                "cannot truncate a segment sealed off to its durable end ({e})"
            );
        }
        self.recount_used(w);
        tracing::error!(
            segment = active.seg.id,
            lost,
            "a write or fsync failed: records since the last good sync are treated as lost; segment sealed off"
        );
    }

    /// Bytes `records` take in a segment at most (frames with their alignment padding).
    pub(crate) fn bundle_need(&self, payload_lens: impl Iterator<Item = usize>) -> u64 {
        payload_lens
            .map(|n| (n + FRAME_HEADER_LEN + self.config.alignment.unit()) as u64)
            .sum()
    }

    /// Makes sure `log` has an active segment with room for `need` more bytes (sealing a full
    /// one, starting a new one); returns its id.
    pub(crate) fn ensure_active(&self, w: &mut Writer, log: Log, need: u64) -> Result<u64> {
        if self.is_full(w, log, need) {
            self.seal_active(w, log)?;
        }
        match w.active[log as usize].as_ref() {
            Some(a) => Ok(a.seg.id),
            None => self.start_segment(w, log),
        }
    }

    /// Whether `log`'s active segment has no room for `need` more bytes (it seals first).
    fn is_full(&self, w: &Writer, log: Log, need: u64) -> bool {
        w.active[log as usize].as_ref().is_some_and(|a| {
            !a.entries.is_empty() && a.len + need + a.seal_overhead() > self.config.segment_bytes
        })
    }

    /// Whether appending `need` bytes to `log` starts a new segment
    /// ([`StateStore::ensure_active`]).
    pub(crate) fn starts_segment(&self, w: &Writer, log: Log, need: u64) -> bool {
        w.active[log as usize].is_none() || self.is_full(w, log, need)
    }

    /// Which log a bundle goes to: with S3-FIFO, the main log when the ghost set remembers one
    /// of its keys, else probation; with the one-log policies, the main log.
    fn placement<'a>(&self, w: &mut Writer, metas: impl Iterator<Item = &'a RecordMeta>) -> Log {
        if self.config.ssd_bytes.is_none() || self.config.policy != Policy::S3Fifo {
            return Log::Main;
        }
        let mut remembered = false;
        for meta in metas {
            remembered |= w.ghost.take(fingerprint(&meta.key));
        }
        if remembered {
            Log::Main
        } else {
            Log::Probation
        }
    }

    /// Refuses the put when writes are refused, or while a recent no-space error holds.
    fn check_writable(&self, w: &mut Writer) -> Result<()> {
        if let Some(reason) = &w.refuse {
            Stats::add(&self.stats.refused_puts, 1);
            return Err(Error::WritesRefused(reason.clone()));
        }
        if let Some(at) = w.no_space_at {
            let waited = at.elapsed();
            if waited < NO_SPACE_RETRY {
                Stats::add(&self.stats.refused_puts, 1);
                return Err(Error::WritesRefused(WriteRefusal::NoSpace {
                    retry_after: NO_SPACE_RETRY - waited,
                }));
            }
            w.no_space_at = None;
        }
        Ok(())
    }

    /// Appends a bundle of records (one write) and indexes them; with [`Durability::EveryPut`]
    /// they are durable, and only then indexed, when this returns. With an SSD budget, segments
    /// are reclaimed first until the bundle fits.
    pub fn put(&self, records: &[(RecordMeta, &[u8])]) -> Result<PutReceipt> {
        if records.is_empty() {
            let w = self.writer();
            return Ok(PutReceipt {
                first_sequence: w.next_sequence,
                records: 0,
                durable: true,
                held: 0,
            });
        }
        if self.admission.enabled() {
            return self.put_admitting(records);
        }
        self.put_written(records)
    }

    /// Writes every record of a bundle (see [`StateStore::put`]).
    fn put_written(&self, records: &[(RecordMeta, &[u8])]) -> Result<PutReceipt> {
        let mut enc = self.encode(records)?;
        let receipt = self.put_encoded(records, &mut enc, true);
        enc.recycle();
        receipt
    }

    /// [`StateStore::put`] under adaptive admission (`crate::admission`): the records read
    /// while waiting are written first; then the bundle's records are written, but for those
    /// admission holds back, which wait in DRAM.
    fn put_admitting(&self, records: &[(RecordMeta, &[u8])]) -> Result<PutReceipt> {
        check_sizes(records)?;
        let hold = self.decide(records);
        let mut written = Vec::new();
        let mut held = Vec::new();
        for ((meta, payload), h) in records.iter().zip(&hold) {
            if *h {
                held.push((meta.clone(), Arc::new(FrameBuf::copy_of(None, payload))));
            } else {
                written.push((meta.clone(), *payload));
            }
        }
        let receipt = if written.is_empty() {
            None
        } else {
            Some(self.put_written(&written)?)
        };
        Ok(self.receipt_with(receipt, self.hold(held)?, records.len(), &hold))
    }

    /// Which of `records` wait in DRAM (see [`crate::admission`]); writes the waiting records
    /// read since the last put first. A record may wait only where the bundle would not fit the
    /// SSD budget unevicted, its key is stored nowhere now and comes once in the bundle, and
    /// the index would take it.
    fn decide(&self, records: &[(RecordMeta, &[u8])]) -> Vec<bool> {
        let need = self.bundle_need(records.iter().map(|(_, p)| p.len()));
        let full = {
            let w = self.writer();
            self.config
                .ssd_bytes
                .is_some_and(|b| w.ssd_used.saturating_add(need) > b)
        };
        let mut times: HashMap<StateKey, usize> = HashMap::new();
        for (m, _) in records {
            *times.entry(m.key).or_default() += 1;
        }
        let eligible = |i: usize| {
            records.get(i).is_some_and(|(m, p)| {
                times.get(&m.key) == Some(&1)
                    && !self.index.contains(&m.key)
                    && self.index.prepare(&m.key, &waiting_record(m, p, 0)).is_ok()
            })
        };
        let decision = self
            .admission
            .decide(records, eligible, full, self.recency.len());
        self.admit_asked(decision.asked);
        decision.hold
    }

    /// The receipt of a bundle of `records` records whose written ones got `written` and whose
    /// held ones (`hold`) took sequences from `first_held`.
    fn receipt_with(
        &self,
        written: Option<PutReceipt>,
        first_held: u64,
        records: usize,
        hold: &[bool],
    ) -> PutReceipt {
        let held = hold.iter().filter(|h| **h).count();
        PutReceipt {
            first_sequence: written.map_or(first_held, |r| r.first_sequence),
            records,
            durable: written.is_none_or(|r| r.durable),
            held,
        }
    }

    /// Writes the waiting records read since the last put, under new sequences, in bundles of
    /// at most half a segment. Each bundle is written only if, under the writer's lock, the
    /// index still names every record of it waiting and none is retired: a record put again or
    /// retired since must not come back. A bundle that fails the check is tried record by
    /// record; a failed write drops its records (a later read misses).
    fn admit_asked(&self, asked: Vec<crate::admission::Waiting>) {
        let cap = usize::try_from(self.segment_bytes() / 2).unwrap_or(usize::MAX);
        let mut at = 0;
        while at < asked.len() {
            let mut bytes = 0;
            let end = at
                + asked[at..]
                    .iter()
                    .take_while(|w| {
                        bytes += w.payload.payload().len();
                        bytes <= cap || bytes == w.payload.payload().len()
                    })
                    .count()
                    .max(1);
            let chunk = &asked[at..end];
            if !self.admit_chunk(chunk) {
                for one in chunk {
                    self.admit_chunk(std::slice::from_ref(one));
                }
            }
            at = end;
        }
    }

    /// Writes `chunk` as one bundle if every record of it still waits (see
    /// [`StateStore::admit_asked`]); false when one no longer does and nothing was written.
    fn admit_chunk(&self, chunk: &[crate::admission::Waiting]) -> bool {
        let records: Vec<(RecordMeta, &[u8])> = chunk
            .iter()
            .map(|w| (w.meta.clone(), w.payload.payload()))
            .collect();
        let waiting = || {
            chunk.iter().all(|w| {
                !self.is_retired(&w.meta.key.namespace, w.sequence)
                    && self
                        .index
                        .get(&w.meta.key)
                        .is_some_and(|r| r.tier == Tier::Dram && r.sequence == w.sequence)
            })
        };
        let written = self.encode(&records).and_then(|mut enc| {
            let r = self.put_encoded_if(&records, &mut enc, true, &waiting);
            enc.recycle();
            r
        });
        match written {
            Ok(Some(_)) => {
                Stats::add(&self.stats.admitted_records, records.len() as u64);
                true
            }
            Ok(None) => chunk.len() == 1,
            Err(e) => {
                tracing::warn!("records read while waiting were not written: {e}");
                for w in chunk {
                    self.index.remove(&w.meta.key, Some(w.sequence));
                }
                true
            }
        }
    }

    /// Lets `held` wait in DRAM and indexes them there, under sequences taken now, all under
    /// the writer's lock (so a retirement or a write of the same key comes wholly before or
    /// after); returns the first sequence. The room takes each record before the index names
    /// it, so a reader the index sends finds it, unless the room has let it go since.
    fn hold(&self, held: Vec<(RecordMeta, Arc<FrameBuf>)>) -> Result<u64> {
        let mut w = self.writer();
        self.check_writable(&mut w)?;
        registered(&w, held.iter().map(|(m, _)| m))?;
        let first = w.next_sequence;
        w.next_sequence += held.len() as u64;
        for (i, (meta, frame)) in held.into_iter().enumerate() {
            let sequence = first + i as u64;
            let key = meta.key;
            // Written meanwhile by another put: that record stands.
            if self.index.get(&key).is_some_and(|r| r.tier == Tier::Ssd) {
                continue;
            }
            let rec = waiting_record(&meta, frame.payload(), sequence);
            let mut itself = false;
            for (k, seq) in self.admission.wait(meta, sequence, frame) {
                if (k, seq) == (key, sequence) {
                    itself = true;
                } else {
                    self.index.remove(&k, Some(seq));
                }
                Stats::add(&self.stats.dropped_waiting, 1);
            }
            Stats::add(&self.stats.held_records, 1);
            if itself {
                continue;
            }
            // Checked by `Index::prepare` when admission chose it: not expected.
            if let Err(e) = self.index_record(&key, rec) {
                tracing::error!("a waiting record could not be indexed: {e}");
            }
        }
        Ok(first)
    }

    /// Encodes a bundle of records for [`StateStore::put_frames`] where the store cannot take
    /// their frames as built ([`StateStore::takes_frames`] is false: compression): the
    /// payload copy, compression and CRC, done by the calling thread without the writer's lock,
    /// so that one thread encodes the next bundle while another appends the last. Refuses the
    /// bundle as [`StateStore::put`] would for its sizes.
    pub fn prepare(&self, records: &[(RecordMeta, &[u8])]) -> Result<Prepared> {
        Ok(Prepared {
            ready: Ready::Encoded(self.encode(records)?),
            records: records.len(),
        })
    }

    /// Gathers the frames of a bundle for [`StateStore::put_frames`] into one direct write
    /// buffer, by the calling thread without the writer's lock (so one thread gathers the next
    /// bundle while another appends the last). `None` where the store would not write them from
    /// one buffer: frames not built for its direct segments, or together smaller than the
    /// write-behind tail takes. Each frame has its own buffer, in 4 KiB pages scattered in
    /// physical memory, and a direct write from them reaches a virtual disk in hundreds of small
    /// segments: on the disk measured, a third slower than the same bytes from a few huge pages
    /// (docs/performance.md).
    pub fn gather(&self, frames: &[&FrameBuf]) -> Option<Prepared> {
        let direct = self.config.alignment == Alignment::Direct && self.takes_frames();
        let total: usize = frames.iter().map(|f| f.frame().len()).sum();
        if !direct
            || total < crate::active::COALESCE_BELOW
            || !frames.iter().all(|f| f.framed_for(Alignment::Direct))
        {
            return None;
        }
        Some(Prepared {
            ready: Ready::Gathered(Gathered::new(frames, total)),
            records: frames.len(),
        })
    }

    /// Encodes `records` (see [`StateStore::prepare`]).
    fn encode(&self, records: &[(RecordMeta, &[u8])]) -> Result<Encoded> {
        check_sizes(records)?;
        Encoded::new(records, self.config.alignment, self.config.compression)
    }

    /// The alignment to build frames for ([`FrameBuf::begin`]), so that
    /// [`StateStore::put_frames`] writes them as they are (unless the store compresses: frames
    /// are then encoded from their payloads).
    pub fn frame_alignment(&self) -> Alignment {
        self.config.alignment
    }

    /// The most memory a frame built in place ([`FrameBuf::begin`]) holds for a payload of
    /// `payload` bytes: its header and payload filled to the alignment unit, and the pad an
    /// aligned buffer may need. Tiny payloads cost far more than their bytes.
    pub fn frame_footprint(&self, payload: u64) -> u64 {
        let fixed = FRAME_HEADER_LEN as u64 + self.config.alignment.unit() as u64;
        let pad = match self.config.alignment {
            Alignment::Direct => crate::io::aligned::DIRECT_ALIGN as u64,
            Alignment::Packed => 0,
        };
        payload.saturating_add(fixed + pad)
    }

    /// Whether [`StateStore::put_frames`] writes frames as built (no compression).
    pub fn takes_frames(&self) -> bool {
        self.config.compression == Compression::None
    }

    /// A buffer for the next frame: the memory of a completed write's frame, or a new one.
    pub fn frame_buf(&self) -> FrameBuf {
        crate::framed::take_spare_frame()
    }

    /// Appends records whose payloads are in [`FrameBuf`]s and indexes them, as
    /// [`StateStore::put`] does. Frames built for [`StateStore::frame_alignment`] are written
    /// as they are: on packed segments out of those buffers, on direct ones gathered into one
    /// write buffer first (by `prepared`, from [`StateStore::gather`] over exactly these
    /// frames, when given). Otherwise they are encoded from their payloads (by `prepared`, from
    /// [`StateStore::prepare`] over exactly these records, when given). Once the DRAM tier is
    /// full it keeps the frames themselves; while it fills it keeps copies. On success
    /// `records` is emptied, and for each record comes back memory for the caller's next
    /// copies, where there is some: that of a copy the tier evicted for it, or the frame itself
    /// when the tier did not keep it and no write still reads it. On a refusal before anything
    /// was written, `records` is left as it was.
    pub fn put_frames(
        &self,
        records: &mut Vec<(RecordMeta, FrameBuf)>,
        prepared: Option<Prepared>,
    ) -> Result<FramesPut> {
        if records.is_empty() {
            return Ok(FramesPut {
                receipt: self.put(&[])?,
                memory: Vec::new(),
                held: Vec::new(),
            });
        }
        if !self.admission.enabled() {
            let (receipt, memory) = self.put_frames_written(records, prepared)?;
            let held = vec![false; memory.len()];
            return Ok(FramesPut {
                receipt,
                memory,
                held,
            });
        }
        let hold = {
            let views: Vec<(RecordMeta, &[u8])> = records
                .iter()
                .map(|(m, f)| (m.clone(), f.payload()))
                .collect();
            check_sizes(&views)?;
            self.decide(&views)
        };
        let all = std::mem::take(records);
        let (mut written, mut held) = (Vec::new(), Vec::new());
        for ((meta, frame), h) in all.into_iter().zip(&hold) {
            if *h {
                held.push((meta, frame));
            } else {
                written.push((meta, frame));
            }
        }
        // The bundle `prepared` was made for is not the one written now.
        let prepared = prepared.filter(|_| held.is_empty());
        let wrote = if written.is_empty() {
            None
        } else {
            match self.put_frames_written(&mut written, prepared) {
                Ok(r) => Some(r),
                Err(e) => {
                    // Nothing held yet: the records the write left go back, in order (all of
                    // them where it was refused before writing anything).
                    let (mut w, mut h) = (written.into_iter(), held.into_iter());
                    records.extend(hold.iter().filter_map(
                        |held| {
                            if *held { h.next() } else { w.next() }
                        },
                    ));
                    return Err(e);
                }
            }
        };
        let (receipt, mut memory) = wrote.map_or((None, Vec::new()), |(r, m)| (Some(r), m));
        let held_frames = held
            .into_iter()
            .map(|(meta, frame)| (meta, Arc::new(frame)))
            .collect();
        let first_held = self.hold(held_frames)?;
        // Memory back in the records' order: none for a record held (the room keeps it).
        let mut back = memory.drain(..);
        let memory = hold
            .iter()
            .map(|h| if *h { None } else { back.next().flatten() })
            .collect();
        Ok(FramesPut {
            receipt: self.receipt_with(receipt, first_held, hold.len(), &hold),
            memory,
            held: hold,
        })
    }

    /// [`StateStore::put_frames`], every record written.
    fn put_frames_written(
        &self,
        records: &mut Vec<(RecordMeta, FrameBuf)>,
        prepared: Option<Prepared>,
    ) -> Result<(PutReceipt, Vec<Option<FrameBuf>>)> {
        let mut total = 0u64;
        for (_, f) in records.iter() {
            total += f.payload().len() as u64;
        }
        if total > MAX_BUNDLE_BYTES {
            return Err(Error::BadBundle(format!(
                "a bundle of {total} bytes exceeds {MAX_BUNDLE_BYTES}"
            )));
        }
        let framed = self.takes_frames()
            && records
                .iter()
                .all(|(_, f)| f.framed_for(self.config.alignment));
        let (receipt, frames) = if framed {
            // The active segment tells whether it holds exactly these frames, and keeps its
            // buffer as a spare when not.
            let gathered = match prepared {
                Some(Prepared {
                    ready: Ready::Gathered(g),
                    ..
                }) => Some(g),
                _ => None,
            };
            self.append_frames(records, gathered)?
        } else {
            self.put_payloads(records, prepared)?
        };
        // After the writer's lock: a copy the tier holds is served only for the key and
        // sequence the index or a pin names, so it may arrive after its record is indexed.
        // A frame the tier did not keep, and no write still reads, comes back itself.
        let memory = frames
            .into_iter()
            .enumerate()
            .map(|(i, (key, frame))| {
                let sequence = receipt.first_sequence + i as u64;
                self.dram
                    .take(&key, sequence, &frame)
                    .or_else(|| Arc::try_unwrap(frame).ok())
            })
            .collect();
        Ok((receipt, memory))
    }

    /// Appends and indexes the payloads of `records` as [`StateStore::put`] does, encoded by
    /// `prepared` when it was made from exactly these records, else here; returns the receipt
    /// and each record's key and frame (for the DRAM tier). On a refusal `records` is left as
    /// it was.
    #[expect(
        clippy::type_complexity,
        reason = "a receipt and the keys with their frames, for the DRAM tier"
    )]
    fn put_payloads(
        &self,
        records: &mut Vec<(RecordMeta, FrameBuf)>,
        prepared: Option<Prepared>,
    ) -> Result<(PutReceipt, Vec<(StateKey, Arc<FrameBuf>)>)> {
        let receipt = {
            let views: Vec<(RecordMeta, &[u8])> = records
                .iter()
                .map(|(m, f)| (m.clone(), f.payload()))
                .collect();
            let mut enc = match prepared {
                Some(Prepared {
                    ready: Ready::Encoded(e),
                    records: n,
                }) if n == records.len() => e,
                _ => self.encode(&views)?,
            };
            let r = self.put_encoded(&views, &mut enc, false);
            enc.recycle_shared();
            r
        }?;
        Ok((receipt, keyed(records)))
    }

    /// The records' checks, placement and room, under the writer's lock: the log to append
    /// `need` bytes to (its active segment has room for them).
    fn admit<'a>(
        &self,
        w: &mut Writer,
        metas: impl Iterator<Item = &'a RecordMeta> + Clone,
        need: u64,
    ) -> Result<Log> {
        self.check_writable(w)?;
        registered(w, metas.clone())?;
        for meta in metas.clone() {
            let probe = Record {
                tier: Tier::Ssd,
                segment: 0,
                offset: 0,
                stored_len: 0,
                range: meta.range,
                sequence: 0,
                format: meta.format,
            };
            self.index
                .prepare(&meta.key, &probe)
                .map_err(|e| Error::BadBundle(e.to_string()))?;
        }
        let log = self.placement(w, metas);
        // An active segment a reader found unreadable is sealed off.
        for l in [Log::Probation, Log::Main] {
            if w.active[l as usize]
                .as_ref()
                .is_some_and(|a| self.is_quarantined(a.seg.id))
            {
                self.lose_unsynced(w, l);
            }
        }
        // Room for the bundle, and for a segment header and footer should it start one.
        let mut room = need + (SEGMENT_HEADER_LEN as u64) * 2 + self.config.alignment.unit() as u64;
        // A store that recycles makes room for a whole segment as it starts one, so the
        // segment reclaimed for it becomes its file (crate::spare).
        if self.recycles() && self.starts_segment(w, log, need) {
            room = room.max(self.config.segment_bytes);
        }
        if let Err(e) = self.make_room(w, room, Some((log, need))) {
            if matches!(e, Error::CapacityExhausted { .. }) {
                Stats::add(&self.stats.refused_puts, 1);
                return Err(e);
            }
            return Err(self.refuse_on(w, e, log));
        }
        if let Err(e) = self.ensure_active(w, log, need) {
            return Err(self.refuse_on(w, e, log));
        }
        Ok(log)
    }

    /// Appends and indexes records whose frames were built for this store's segments (see
    /// [`StateStore::put_frames`]); returns the receipt and each record's key and frame.
    #[expect(
        clippy::type_complexity,
        reason = "a receipt and the keys with their frames, for the DRAM tier"
    )]
    fn append_frames(
        &self,
        records: &mut Vec<(RecordMeta, FrameBuf)>,
        gathered: Option<Gathered>,
    ) -> Result<(PutReceipt, Vec<(StateKey, Arc<FrameBuf>)>)> {
        let mut w = self.writer();
        let need = self.bundle_need(records.iter().map(|(_, f)| f.payload().len()));
        let log = self.admit(&mut w, records.iter().map(|(m, _)| m), need)?;
        let first = w.next_sequence;
        let Some(active) = w.active[log as usize].as_mut() else {
            return Err(Error::WritesRefused(WriteRefusal::SealedOff));
        };
        if !active.takes_frames(self.config.alignment) {
            // A segment resumed with other settings than the store's now: encode here.
            drop(w);
            return self.put_payloads(records, None);
        }
        let before = active.len;
        let coalesce = self.config.durability != Durability::EveryPut;
        let metas: Vec<RecordMeta> = records.iter().map(|(m, _)| m.clone()).collect();
        let appended = active.append_frames(std::mem::take(records), first, coalesce, gathered);
        let (entries, frames) = match appended {
            Ok(x) => x,
            Err(e) => return Err(self.refuse_on(&mut w, e, log)),
        };
        let written = active.len - before;
        let payloads: Vec<(RecordMeta, &[u8])> = metas
            .into_iter()
            .zip(&frames)
            .map(|(m, f)| (m, f.payload()))
            .collect();
        let receipt = self.index_appended(&mut w, log, written, &entries, &payloads, false)?;
        let keyed = payloads
            .iter()
            .map(|(m, _)| m.key)
            .zip(frames.iter().cloned())
            .collect();
        Ok((receipt, keyed))
    }

    /// Appends `enc`, encoded from `records`; the DRAM tier copies each payload when `dram`.
    fn put_encoded(
        &self,
        records: &[(RecordMeta, &[u8])],
        enc: &mut Encoded,
        dram: bool,
    ) -> Result<PutReceipt> {
        self.put_encoded_if(records, enc, dram, &|| true)?
            .ok_or(Error::WritesRefused(WriteRefusal::SealedOff))
    }

    /// [`StateStore::put_encoded`], once `still` says yes under the writer's lock; `None`
    /// (nothing written) when it says no.
    fn put_encoded_if(
        &self,
        records: &[(RecordMeta, &[u8])],
        enc: &mut Encoded,
        dram: bool,
        still: &dyn Fn() -> bool,
    ) -> Result<Option<PutReceipt>> {
        let mut w = self.writer();
        if !still() {
            return Ok(None);
        }
        let log = self.admit(
            &mut w,
            records.iter().map(|(m, _)| m),
            self.bundle_need(records.iter().map(|(_, p)| p.len())),
        )?;
        let first = w.next_sequence;
        let Some(active) = w.active[log as usize].as_mut() else {
            return Err(Error::WritesRefused(WriteRefusal::SealedOff));
        };
        let before = active.len;
        let coalesce = self.config.durability != Durability::EveryPut;
        let appended = match active.append_encoded(enc, first, coalesce) {
            Ok(Some(e)) => Ok(e),
            // Encoded for other settings than this segment's: encode again here.
            Ok(None) => active.append(records, first),
            Err(e) => Err(e),
        };
        let entries = match appended {
            Ok(e) => e,
            Err(e) => return Err(self.refuse_on(&mut w, e, log)),
        };
        let written = active.len - before;
        self.index_appended(&mut w, log, written, &entries, records, dram)
            .map(Some)
    }

    /// Accounts for records just appended to `log` (`written` bytes, `entries` in order of
    /// `records`), syncs them with [`Durability::EveryPut`], and indexes them — or holds them
    /// back until durable with [`Durability::Group`]; the DRAM tier copies each payload when
    /// `dram`.
    fn index_appended(
        &self,
        w: &mut Writer,
        log: Log,
        written: u64,
        entries: &[IndexEntry],
        records: &[(RecordMeta, &[u8])],
        dram: bool,
    ) -> Result<PutReceipt> {
        let first = w.next_sequence;
        w.ssd_used += written;
        w.next_sequence += records.len() as u64;
        let durable = self.config.durability == Durability::EveryPut;
        if durable {
            self.sync_log(w, log)?;
        }
        let Some(active) = w.active[log as usize].as_mut() else {
            return Err(Error::WritesRefused(WriteRefusal::SealedOff));
        };
        let seg = u32::try_from(active.seg.id).unwrap_or_default();
        let held_back = self.config.durability == Durability::Group;
        for (e, (meta, payload)) in entries.iter().zip(records) {
            let rec = Record {
                tier: Tier::Ssd,
                segment: seg,
                offset: e.offset,
                stored_len: e.stored_len,
                range: meta.range,
                sequence: e.record_sequence,
                format: meta.format,
            };
            self.recency.insert(meta.key, &rec, None);
            if held_back {
                // Readable once durable (`sync`, or the segment's seal).
                active.staged.push((meta.key, rec));
            } else {
                let previous = self.index_record(&meta.key, rec)?;
                if !durable {
                    active
                        .unsynced
                        .push((meta.key, e.record_sequence, previous));
                }
            }
            // The copy is reachable only through the index or a pin, at this sequence.
            if dram {
                self.dram.insert(&meta.key, e.record_sequence, payload);
            }
            Stats::add(&self.stats.put_bytes, payload.len() as u64);
        }
        Stats::add(&self.stats.puts, 1);
        Stats::add(&self.stats.put_records, records.len() as u64);
        // The bundle and the hits read before it share a tick.
        self.recency.advance();
        Ok(PutReceipt {
            first_sequence: first,
            records: records.len(),
            durable,
            held: 0,
        })
    }

    /// The failure policy for a write or segment-lifecycle error on `log`: `log`'s active
    /// segment is sealed off, its records since the last good sync lost (the next put starts a
    /// new segment); no space also refuses puts for [`NO_SPACE_RETRY`]. A full disk is sealed
    /// off too: the failed write may be an earlier put's, still in flight, or part of this
    /// put's frames may be in the file.
    pub(crate) fn refuse_on(&self, w: &mut Writer, e: Error, log: Log) -> Error {
        Stats::add(&self.stats.refused_puts, 1);
        let no_space = matches!(&e, Error::Io { source, .. } if source.kind() == std::io::ErrorKind::StorageFull);
        if no_space {
            tracing::error!("no space left: refusing puts, still serving reads ({e})");
            w.no_space_at = Some(Instant::now());
        } else {
            tracing::error!("write failed: sealing the active segment off ({e})");
        }
        self.lose_unsynced(w, log);
        e
    }

    /// Indexes `rec` of `key` (newer wins); returns the record it replaced, noting where a
    /// superseded one still lies.
    fn index_record(&self, key: &StateKey, rec: Record) -> Result<Option<Record>> {
        // A written record replaces a waiting one of its key, whatever their sequences: a
        // record staged before its key was held back (its sync comes later) must not stand
        // behind a copy in DRAM.
        if rec.tier == Tier::Ssd
            && let Some(cur) = self.index.get(key)
            && cur.tier == Tier::Dram
        {
            self.index.remove(key, Some(cur.sequence));
        }
        let previous = match self.index.insert(key, rec)? {
            Insert::Replaced { previous } => Some(previous),
            Insert::Inserted | Insert::Kept { .. } => None,
        };
        if let Some(p) = previous
            && p.tier == Tier::Ssd
            && p.segment != rec.segment
        {
            self.superseded.note(key, u64::from(p.segment));
        }
        Ok(previous)
    }

    /// Indexes the records `active` held back until durable (it has just been synced), but for
    /// those a retirement since their put covers.
    fn index_staged(&self, active: &mut Active) {
        for (key, rec) in active.staged.drain(..) {
            if self.is_retired(&key.namespace, rec.sequence) {
                self.dram.remove(&key, rec.sequence);
                continue;
            }
            if let Err(e) = self.index_record(&key, rec) {
                // Checked by `Index::prepare` before the put: not expected; a miss, not an error.
                tracing::error!("a durable record could not be indexed: {e}");
                self.dram.remove(&key, rec.sequence);
            }
        }
    }

    /// Makes the records held back until durable readable (syncing the logs that hold some)
    /// before anything copies records forward under new sequences (compaction, reclaim): a copy
    /// of a key's older record must never overtake a newer one waiting for its sync. A failed
    /// sync loses them, as any failed sync does (the next [`StateStore::sync`] reports it).
    pub(crate) fn publish_held_back(&self, w: &mut Writer) {
        for log in [Log::Probation, Log::Main] {
            if w.active[log as usize]
                .as_ref()
                .is_some_and(|a| !a.staged.is_empty())
            {
                let _ = self.sync_log(w, log);
            }
        }
    }

    /// Syncs `log`'s active segment, applying the fsync policy on failure; the records it held
    /// back until durable become readable.
    pub(crate) fn sync_log(&self, w: &mut Writer, log: Log) -> Result<()> {
        let Some(active) = w.active[log as usize].as_mut() else {
            return Ok(());
        };
        if let Err(e) = active.sync() {
            self.lose_unsynced(w, log);
            return Err(e);
        }
        self.index_staged(active);
        Ok(())
    }

    /// Makes every accepted put durable (with [`Durability::Manual`] or [`Durability::Group`]).
    /// Refused with [`Error::Lost`] when records accepted since the last sync were lost to a
    /// failed write or fsync meanwhile (they must be put again).
    pub fn sync(&self) -> Result<()> {
        let mut w = self.writer();
        let a = self.sync_log(&mut w, Log::Probation);
        let b = self.sync_log(&mut w, Log::Main);
        // A failed sync reports the loss itself.
        let lost = std::mem::take(&mut w.lost_since_sync);
        a.and(b)?;
        match lost {
            0 => Ok(()),
            records => Err(Error::Lost { records }),
        }
    }
}
