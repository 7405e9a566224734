//! OrbitKV's store: state records in a log of segment files with a manifest, an in-DRAM index,
//! and verified reads.
//!
//! - [`StateStore::open`] locks the data directory, checks its format version, replays the
//!   manifest, opens sealed segments from their footers alone, scans the active segment
//!   (truncating a torn tail, keeping every valid record after a corrupt one), seals it, and
//!   rebuilds the index ([`RecoveryReport`] says what it found).
//! - [`StateStore::put`] appends a bundle of records as frames to the active segment (one write),
//!   indexes them, and with [`Durability::EveryPut`] syncs before returning; the receipt says
//!   whether the records are durable. With [`Durability::Manual`] small bundles gather in a
//!   write-behind tail and large ones are written asynchronously (several writes in flight, so a
//!   putter encodes its next bundle while the device takes the previous ones); either way the
//!   records are readable at once, from memory until their write completes.
//! - [`StateStore::get`] reads a record and verifies it — the full key and sequence in its frame
//!   header, the CRC fused with the copy — a mismatch is a miss, a counted failure and the
//!   record's removal from the index, never bytes returned.
//! - [`StateStore::retire_namespace`] is one durable manifest record with a sequence watermark:
//!   no older record of the namespace is served again, before or after a restart, from either
//!   tier, through the index or through a pin taken before the retirement.
//!
//! Failure policy: a failed fsync is never retried as if the data were safe — the records written
//! since the last good sync are dropped from the index (the older records they replaced are
//! restored) and counted as lost, and the segment is sealed off (the next put opens a new one;
//! bytes the device did persist may reappear after a restart, never different bytes for their
//! key); on ENOSPC the store refuses puts and keeps serving reads, also when it cannot seal the
//! segments it recovers on open; a failed directory fsync of a manifest checkpoint refuses
//! further writes; an I/O error reading a segment quarantines it (its records become misses) and,
//! if it is the active one, seals it off. A write that fails in flight is a failed write: it is
//! reported by the next put, sync or seal, and the records since the last good sync are lost as
//! above. With [`Durability::EveryPut`] a record is indexed only
//! once it is durable; with [`Durability::Manual`] readers may see records not yet synced.
//!
//! All I/O goes through [`io::Io`]; tests use `io::fault::FaultIo` (the `fault-io` feature) to
//! inject failures and power loss.

mod active;
mod admission;
mod compactor;
mod config;
pub mod dir;
mod dram;
pub mod error;
mod forward;
mod framed;
pub mod fsck;
mod ghost;
pub mod io;
mod manifest;
mod open;
mod pins;
mod read;
mod recency;
mod reclaimer;
mod recover;
mod spare;
pub mod stats;
mod superseded;
mod write;

use std::any::Any;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::Instant;

use orbitkv_index::Index;
use orbitkv_state::{Namespace, StateKey};
use orbitkv_wal::{ManifestRecord, NamespaceInfo, SegmentState};

use crate::active::{Active, SegmentFile};
pub use crate::admission::{AdmissionChooser, SHADOW_RECORDS, SHADOW_WINDOW};
pub use crate::compactor::{CompactReport, SegmentStat};
pub use crate::config::{
    Admission, DEFAULT_SEGMENT_BYTES, Durability, MAX_BUNDLE_BYTES, MAX_SEGMENT_BYTES,
    MIN_SSD_BYTES, NO_SPACE_RETRY, RECORD_LRU_SEGMENTS_PER_BUDGET, SEGMENTS_PER_BUDGET,
    SEQUENCE_LIMIT, StoreConfig, ssd_bytes_holding, ssd_records_held,
};
pub use crate::dir::Layout;
use crate::dram::DramTier;
pub use crate::error::{Error, Result, Retry, WriteRefusal};
pub use crate::framed::FrameBuf;
use crate::ghost::Ghost;
use crate::io::Io;
pub use crate::manifest::MAX_MANIFEST_BYTES;
use crate::manifest::Manifest;
pub use crate::pins::Pin;
use crate::pins::Pins;
pub(crate) use crate::read::Sink;
use crate::recency::Recency;
pub use crate::reclaimer::Policy;
use crate::reclaimer::{Log, ReadMarks};
pub use crate::recover::MAX_SEGMENT_FILE_BYTES;
pub use crate::recover::RecoveryReport;
use crate::stats::{Stats, StatsSnapshot};
use crate::superseded::Superseded;
pub use crate::write::{FramesPut, Prepared, PutReceipt};

/// How full the tiers are, from [`StateStore::usage`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    /// File bytes of every file in the segments directory: the open segments, and files whose
    /// deletion failed, orphans and quarantined segments.
    pub ssd_used: u64,
    /// The SSD budget, if any.
    pub ssd_budget: Option<u64>,
    /// Segments in the probation log.
    pub probation_segments: usize,
    /// Payload bytes in the DRAM tier.
    pub dram_used: u64,
    /// The DRAM budget.
    pub dram_budget: u64,
    /// Copies in the DRAM tier.
    pub dram_entries: u64,
    /// Pins held.
    pub pins: usize,
    /// Records indexed (those waiting for SSD admission included).
    pub records: usize,
    /// Records waiting in DRAM for SSD admission.
    pub waiting_records: u64,
    /// The bytes they take, as frames (header and payload, in 4 KiB pages).
    pub waiting_bytes: u64,
    /// Puts are refused now: for good until a restart (read-only, a failed checkpoint, the log
    /// says why), or for [`NO_SPACE_RETRY`] after a full disk.
    pub writes_refused: bool,
}

struct Writer {
    manifest: Manifest,
    /// The active segment of each log ([`Log`] indexes it).
    active: [Option<Active>; 2],
    next_sequence: u64,
    /// Writes are refused for good (read-only, a failed checkpoint, an unsealable recovery).
    refuse: Option<WriteRefusal>,
    /// The disk reported no space at this time; puts are refused until [`NO_SPACE_RETRY`] later.
    no_space_at: Option<Instant>,
    /// Records accepted by a put but lost to a failed write or fsync since the last
    /// [`StateStore::sync`] (which reports them).
    lost_since_sync: u64,
    /// File bytes of every file in the segments directory: the open segments, and files whose
    /// deletion failed, orphans and quarantined segments.
    ssd_used: u64,
    /// Segments of the probation log (S3-FIFO). Segments recovered on open are in the main log.
    probation: BTreeSet<u64>,
    /// Keys recently dropped from the probation log unread.
    ghost: Ghost,
    /// The spare segment file's size, when one is kept (counted in `ssd_used`, as every file in
    /// the segments directory is).
    spare: Option<u64>,
    /// Bytes punched out of each open segment ([`Policy::RecordLru`]): freed, so not counted in
    /// `ssd_used`.
    punched: HashMap<u64, u64>,
    /// No more punches: the file system refused one as unsupported, or does not list the
    /// holes they make. Records are evicted without one.
    punch_unsupported: bool,
    /// The first punch's hole was looked for in the file's list of holes.
    punch_checked: bool,
    /// Segments punched since their last fsync.
    unsynced_punches: BTreeSet<u64>,
}

impl Writer {
    /// Appends `record` to the manifest under the next sequence, which it takes; returns that
    /// sequence. A failed append takes none.
    fn append_manifest(&mut self, record: ManifestRecord) -> Result<u64> {
        self.append_manifest_with(|_| record)
    }

    /// As [`Writer::append_manifest`], for a record that names its own sequence.
    fn append_manifest_with(&mut self, record: impl FnOnce(u64) -> ManifestRecord) -> Result<u64> {
        let sequence = self.next_sequence;
        self.manifest.append(sequence, record(sequence))?;
        self.next_sequence = sequence.saturating_add(1);
        Ok(sequence)
    }

    /// Takes the next sequence (a record copied forward, a manifest checkpoint).
    fn take_sequence(&mut self) -> u64 {
        let sequence = self.next_sequence;
        self.next_sequence = sequence.saturating_add(1);
        sequence
    }
}

/// The store. Share it by `Arc`; every method takes `&self`. Readers never wait for the writer.
pub struct StateStore {
    io: Arc<dyn Io>,
    layout: Layout,
    config: StoreConfig,
    directory_id: [u8; 16],
    _lock: Option<Box<dyn Any + Send + Sync>>,
    index: Index,
    segments: RwLock<BTreeMap<u64, Arc<SegmentFile>>>,
    quarantined: RwLock<HashSet<u64>>,
    /// Segments a compaction could not read (an I/O error): left out of later compactions until
    /// the store is opened again, so one bad sector does not stop every compaction.
    uncompactable: Mutex<HashSet<u64>>,
    writer: Mutex<Writer>,
    stats: Stats,
    report: RecoveryReport,
    dram: DramTier,
    /// Adaptive SSD admission and its waiting room (off unless configured).
    admission: admission::Admission,
    pins: Pins,
    read_marks: ReadMarks,
    /// The record order of [`Policy::RecordLru`] (empty under the other policies).
    recency: Recency,
    superseded: Superseded,
    /// Each retired namespace's watermark, as the manifest holds it: read without the writer's
    /// lock by reads that bypass the index (pinned reads).
    retired: RwLock<HashMap<Namespace, u64>>,
}

impl StateStore {
    /// What recovery found when the store was opened.
    pub fn recovery_report(&self) -> &RecoveryReport {
        &self.report
    }

    /// Counters.
    pub fn stats(&self) -> StatsSnapshot {
        self.stats.snapshot()
    }

    /// Records lost to failed writes or fsyncs since the store opened; it only grows. A caller
    /// that reads it before its puts and finds it grown after its sync cannot count them
    /// durable, whichever [`StateStore::sync`] reported the loss.
    pub fn lost_records(&self) -> u64 {
        self.stats
            .lost_records
            .load(std::sync::atomic::Ordering::Acquire)
    }

    /// How full the tiers are.
    pub fn usage(&self) -> Usage {
        let (waiting_records, waiting_bytes) = self.admission.waiting();
        let w = self.writer();
        Usage {
            ssd_used: w.ssd_used,
            ssd_budget: self.config.ssd_bytes,
            probation_segments: w.probation.len(),
            dram_used: self.dram.used_bytes(),
            dram_budget: self.config.dram_bytes,
            dram_entries: self.dram.len(),
            pins: self.pins.len(),
            records: self.index.len(),
            waiting_records,
            waiting_bytes,
            writes_refused: w.refuse.is_some()
                || w.manifest.is_uncertain()
                || w.no_space_at
                    .is_some_and(|at| at.elapsed() < NO_SPACE_RETRY),
        }
    }

    /// The size a segment is sealed at (the configured one, bounded by the SSD budget); a
    /// bundle larger than it takes a segment of its own.
    pub fn segment_bytes(&self) -> u64 {
        self.config.segment_bytes
    }

    /// The index (for probes and inspection).
    pub fn index(&self) -> &Index {
        &self.index
    }

    fn writable(&self) -> Result<()> {
        if self.config.read_only {
            return Err(Error::WritesRefused(WriteRefusal::ReadOnly));
        }
        Ok(())
    }

    /// Refuses manifest changes while writes are refused (a failed checkpoint may have left
    /// the manifest's rename undurable: a record appended now could vanish with it).
    fn manifest_writable(w: &Writer) -> Result<()> {
        match &w.refuse {
            Some(reason) => Err(Error::WritesRefused(reason.clone())),
            None => Ok(()),
        }
    }

    /// The open segment `id`, if it is one.
    pub(crate) fn segment_file(&self, id: u64) -> Option<Arc<SegmentFile>> {
        self.segments
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&id)
            .cloned()
    }

    fn writer(&self) -> MutexGuard<'_, Writer> {
        self.writer.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers a namespace (durably), so its records may be put. A namespace registered
    /// already with the same summary is accepted also while writes are refused (a read-only
    /// store still serves the namespaces it holds).
    pub fn register_namespace(&self, namespace: Namespace, info: NamespaceInfo) -> Result<()> {
        let mut w = self.writer();
        if w.manifest
            .state
            .snapshot
            .namespaces
            .get(&namespace)
            .is_some_and(|n| n.info == info)
        {
            return Ok(());
        }
        self.writable()?;
        Self::manifest_writable(&w)?;
        w.append_manifest(ManifestRecord::NamespaceRegistered { namespace, info })?;
        Ok(())
    }

    /// Retires `namespace`: one durable manifest record whose sequence is the watermark; no record
    /// of the namespace older than it is served again. Returns the watermark.
    pub fn retire_namespace(&self, namespace: Namespace) -> Result<u64> {
        tracing::debug!(phase = "retire", step = "begin", namespace = %namespace);
        self.writable()?;
        let mut w = self.writer();
        Self::manifest_writable(&w)?;
        let seq = w.append_manifest_with(|watermark| ManifestRecord::NamespaceRetired {
            namespace,
            watermark,
        })?;
        self.retired
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(namespace, seq);
        self.index.retire(&namespace, seq);
        tracing::debug!(phase = "retire", step = "end", namespace = %namespace, watermark = seq);
        Ok(seq)
    }

    /// Whether `namespace` was retired above `sequence`: a record of it with that sequence is
    /// never served again, through the index or a pin.
    pub fn is_retired(&self, namespace: &Namespace, sequence: u64) -> bool {
        self.retired
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(namespace)
            .is_some_and(|w| sequence < *w)
    }

    /// How many keys of `chain`, from the first, are stored (one call).
    pub fn probe(&self, chain: &[StateKey]) -> usize {
        self.index.probe(chain)
    }

    /// Namespaces and their retirement watermarks, as the manifest holds them.
    pub fn namespaces(&self) -> Vec<(Namespace, NamespaceInfo, Option<u64>)> {
        let w = self.writer();
        w.manifest
            .state
            .snapshot
            .namespaces
            .iter()
            .map(|(ns, st)| (*ns, st.info.clone(), st.retired_below))
            .collect()
    }

    /// Segment ids with whether each is sealed.
    pub fn segments(&self) -> Vec<(u64, bool)> {
        let w = self.writer();
        w.manifest
            .state
            .snapshot
            .segments
            .iter()
            .map(|(id, st)| (*id, matches!(st, SegmentState::Sealed(..))))
            .collect()
    }

    /// The manifest's current length in bytes.
    pub fn manifest_len(&self) -> u64 {
        self.writer().manifest.len()
    }

    /// The data directory.
    pub fn data_dir(&self) -> &Path {
        &self.layout.root
    }

    /// Seals the active segment and makes the punches durable, and closes, so the next open
    /// reads footers only. Dropping the store without `close` leaves the active segment to be
    /// scanned (and sealed) on next open, and punches not yet synced may be lost with a crash.
    pub fn close(self) -> Result<()> {
        let mut w = self.writer();
        let a = self.seal_active(&mut w, Log::Probation);
        let b = self.seal_active(&mut w, Log::Main);
        let c = self.sync_punches(&mut w);
        a.and(b).and(c)
    }
}

impl Drop for StateStore {
    /// Writes what waits in the write-behind tails (not synced: that is `sync`'s or `close`'s
    /// job), so dropping a store without closing it loses no accepted put unless the machine
    /// goes down too.
    fn drop(&mut self) {
        let mut w = self.writer();
        for a in w.active.iter_mut().flatten() {
            if let Err(e) = a.write_out() {
                tracing::error!(
                    segment = a.seg.id,
                    "writing the write-behind tail at drop: {e}"
                );
            }
        }
    }
}
