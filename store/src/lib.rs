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
//! All I/O goes through [`io::Io`]; tests use [`io::fault::FaultIo`] to inject failures and power
//! loss.

mod compactor;
pub mod dir;
mod dram;
pub mod error;
pub mod fsck;
mod ghost;
pub mod io;
mod manifest;
mod pins;
mod reclaimer;
mod recover;
mod segment;
pub mod stats;
mod superseded;

use std::any::Any;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use orbitkv_index::{Index, Insert, Record, Tier};
use orbitkv_segments::{
    Alignment, Compression, FRAME_HEADER_LEN, FrameBody, FrameHeader, RecordMeta,
    SEGMENT_HEADER_LEN, SegmentHeader,
};
use orbitkv_state::{Namespace, StateKey};
use orbitkv_wal::{ManifestRecord, NamespaceInfo, SegmentCreated, SegmentSealed, SegmentState};

pub use crate::compactor::{CompactReport, SegmentStat};
pub use crate::dir::Layout;
use crate::dram::DramTier;
use crate::error::io_err;
pub use crate::error::{Error, Result, Retry, WriteRefusal};
use crate::ghost::{Ghost, fingerprint};
use crate::io::aligned::{DIRECT_ALIGN, aligned_buffer};
pub use crate::manifest::MAX_MANIFEST_BYTES;
pub use crate::recover::MAX_SEGMENT_FILE_BYTES;

/// Reader-thread buffers larger than this are freed after use.
const MAX_KEPT_READ_BUF: usize = 16 << 20;

thread_local! {
    /// Each reader thread's aligned frame buffer (grown as needed; freed after a frame over
    /// [`MAX_KEPT_READ_BUF`]) and its pad.
    static READ_BUF: std::cell::RefCell<(Vec<u8>, usize)> = const { std::cell::RefCell::new((Vec::new(), 0)) };
}
use crate::io::{Io, OpenMode};
use crate::manifest::Manifest;
pub use crate::pins::Pin;
use crate::pins::Pins;
pub use crate::reclaimer::Policy;
use crate::reclaimer::{Log, ReadMarks};
pub use crate::recover::RecoveryReport;
use crate::segment::{Active, Encoded, SegmentFile};
use crate::stats::{Stats, StatsSnapshot};
use crate::superseded::Superseded;

/// When put bytes become durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// Every put syncs before it returns.
    EveryPut,
    /// Puts return once written; [`StateStore::sync`] makes them durable (group commit).
    /// Readers may see records not yet durable.
    Manual,
    /// Puts return once written (several writes in flight); a record is indexed — readable —
    /// only once a [`StateStore::sync`] or a segment's seal has made it durable: readers never
    /// see a record a failed write or fsync could still take away. One sync makes every put
    /// before it durable (group commit across putters).
    Group,
}

/// How to open a store.
#[derive(Debug, Clone)]
pub struct StoreConfig {
    /// The data directory (created if missing).
    pub data_dir: PathBuf,
    /// A segment is sealed and a new one started once it would pass this size.
    pub segment_bytes: u64,
    /// Frame alignment of new segments.
    pub alignment: Alignment,
    /// Payload compression of new segments.
    pub compression: Compression,
    /// Sync policy.
    pub durability: Durability,
    /// Records the index should hold without rebuilding its tables.
    pub index_capacity: usize,
    /// The manifest is rewritten as one checkpoint after this many records.
    pub checkpoint_every: u64,
    /// Open without changing anything on disk (no truncation, no sealing; puts are refused), for
    /// inspection. The directory is still locked.
    pub read_only: bool,
    /// The SSD tier's budget: segment files never outgrow it (beyond one bundle being written),
    /// whole segments being reclaimed by `policy`. `None`: unbounded (the disk is the limit).
    pub ssd_bytes: Option<u64>,
    /// The DRAM tier's budget for copies of hot payloads (0: no DRAM tier).
    pub dram_bytes: u64,
    /// Which segments the SSD tier reclaims when full.
    pub policy: Policy,
}

impl StoreConfig {
    /// Defaults for `data_dir`: 256 MiB packed segments, no compression, a sync per put.
    pub fn new(data_dir: impl Into<PathBuf>) -> Self {
        Self {
            data_dir: data_dir.into(),
            segment_bytes: 256 << 20,
            alignment: Alignment::Packed,
            compression: Compression::None,
            durability: Durability::EveryPut,
            index_capacity: 0,
            checkpoint_every: manifest::CHECKPOINT_EVERY,
            read_only: false,
            ssd_bytes: None,
            dram_bytes: 0,
            policy: Policy::S3Fifo,
        }
    }
}

/// Largest segment size accepted: index entries address offsets below 32 GiB, and a segment
/// may exceed its size by one bundle.
pub const MAX_SEGMENT_BYTES: u64 = 16 << 30;
/// Largest bundle (sum of payloads) accepted in one put.
pub const MAX_BUNDLE_BYTES: u64 = 1 << 30;
/// Smallest SSD budget accepted.
pub const MIN_SSD_BYTES: u64 = 1 << 20;
/// With an SSD budget, a segment is at most this fraction of it, so reclaiming one segment
/// frees little of what is still wanted (measured on the shared trace: 1/64 keeps within 0.2%
/// of the hit ratio of finer segments, 1/8 loses 2–6%).
pub const SEGMENTS_PER_BUDGET: u64 = 64;
/// After the disk reported no space, puts are refused for this long before one is tried again.
pub const NO_SPACE_RETRY: Duration = Duration::from_secs(1);

/// A bundle encoded by [`StateStore::prepare`], waiting for [`StateStore::put_prepared`].
pub struct Prepared {
    enc: Encoded,
    records: usize,
}

/// What a put did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PutReceipt {
    /// Sequence of the bundle's first record.
    pub first_sequence: u64,
    /// Records written.
    pub records: usize,
    /// Whether they are durable now.
    pub durable: bool,
}

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
    /// Records indexed.
    pub records: usize,
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
}

/// The store. Share it by `Arc`; every method takes `&self`. Readers never wait for the writer.
pub struct StateStore {
    io: Arc<dyn Io>,
    layout: Layout,
    config: StoreConfig,
    directory_id: [u8; 16],
    _lock: Box<dyn Any + Send + Sync>,
    index: Index,
    segments: RwLock<BTreeMap<u64, Arc<SegmentFile>>>,
    quarantined: RwLock<HashSet<u64>>,
    writer: Mutex<Writer>,
    stats: Stats,
    report: RecoveryReport,
    dram: DramTier,
    pins: Pins,
    read_marks: ReadMarks,
    superseded: Superseded,
    /// Each retired namespace's watermark, as the manifest holds it: read without the writer's
    /// lock by reads that bypass the index (pinned reads).
    retired: RwLock<HashMap<Namespace, u64>>,
}

pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// A directory id: distinguishes data directories (not a secret). Time and process id suffice.
fn random_id() -> [u8; 16] {
    let t = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    (t ^ (u128::from(std::process::id()) << 96)).to_le_bytes()
}

impl StateStore {
    /// Opens (creating if needed) the store in `config.data_dir` on `io`, recovering it.
    pub fn open(io: Arc<dyn Io>, mut config: StoreConfig) -> Result<Self> {
        let layout = Layout::new(&config.data_dir);
        if config.segment_bytes > MAX_SEGMENT_BYTES || config.segment_bytes < 8 << 10 {
            return Err(Error::BadConfig(format!(
                "segment size {} must lie between 8 KiB and {} bytes",
                config.segment_bytes, MAX_SEGMENT_BYTES
            )));
        }
        if let Some(budget) = config.ssd_bytes {
            if budget < MIN_SSD_BYTES {
                return Err(Error::BadConfig(format!(
                    "an SSD budget of {budget} bytes is below the minimum of {MIN_SSD_BYTES}"
                )));
            }
            config.segment_bytes = config
                .segment_bytes
                .min(budget / SEGMENTS_PER_BUDGET)
                .max(8 << 10);
        }
        io.create_dir_all(&layout.segments())
            .map_err(io_err(&layout.segments(), "create directory"))?;
        let lock = io.lock_exclusive(&layout.lock()).map_err(|e| {
            if e.kind() == std::io::ErrorKind::WouldBlock {
                Error::Locked {
                    path: layout.root.clone(),
                }
            } else {
                io_err(&layout.lock(), "lock")(e)
            }
        })?;
        if config.read_only && !io.exists(&layout.header()) {
            return Err(Error::Damaged {
                path: layout.root.clone(),
                reason: "no store here (no orbitkv.dir)".to_owned(),
            });
        }
        let (header, _) = dir::open_header(io.as_ref(), &layout, now_ms(), random_id())?;
        let opened = Manifest::open(io.as_ref(), &layout, config.read_only)?;
        let mut manifest = opened.manifest;
        let stats = Stats::default();
        let index = Index::with_capacity(config.index_capacity);
        let report = RecoveryReport {
            manifest_truncated: opened.truncated,
            bytes_read: opened.bytes_read,
            ..RecoveryReport::default()
        };
        let rec = recover::recover(
            io.as_ref(),
            &layout,
            &manifest.state,
            &header.directory_id,
            config.read_only,
            &index,
            report,
        )?;
        let report = rec.report;
        let rec_superseded = rec.superseded;
        let mut next_sequence = rec
            .max_record_sequence
            .max(manifest.state.last_sequence)
            .map_or(1, |s| s + 1);
        let mut segments = rec.segments;
        let mut refuse = config.read_only.then_some(WriteRefusal::ReadOnly);
        // Seal what was active (or forget it when empty): recovery scans only one active tail.
        // If that cannot be written (a full disk), the store still opens and serves reads.
        let actives = if config.read_only {
            Vec::new()
        } else {
            rec.actives
        };
        for (created, found) in actives {
            let id = created.segment_id;
            let result = match found {
                Some(a) if !a.entries.is_empty() => {
                    let mut active =
                        Active::resume(a.header, a.file, a.len, a.entries, config.compression);
                    active.seal().and_then(|(digest, data_end)| {
                        manifest.append(
                            next_sequence,
                            ManifestRecord::SegmentSealed(SegmentSealed {
                                segment_id: id,
                                footer_digest: digest,
                                records: active.entries.len() as u64,
                                data_end,
                            }),
                        )
                    })
                }
                other => manifest
                    .append(
                        next_sequence,
                        ManifestRecord::SegmentDeleted { segment_id: id },
                    )
                    .map(|()| {
                        segments.remove(&id);
                        if let Some(a) = other {
                            if let Err(e) = io.remove_file(&a.file.path)
                                && e.kind() != std::io::ErrorKind::NotFound
                            {
                                Stats::add(&stats.failed_deletes, 1);
                                tracing::error!(
                                    path = %a.file.path.display(),
                                    "cannot delete an empty recovered segment file ({e}); it stays counted in the SSD budget until `orbitkv fsck --repair` removes it"
                                );
                            }
                            if let Err(e) = io.sync_dir(&layout.segments()) {
                                Stats::add(&stats.failed_dir_syncs, 1);
                                tracing::warn!(
                                    path = %layout.segments().display(),
                                    "cannot fsync the segments directory after deleting a file ({e})"
                                );
                            }
                        }
                    }),
            };
            match result {
                Ok(()) => next_sequence += 1,
                Err(e) => {
                    tracing::error!(
                        segment = id,
                        "cannot seal a recovered segment, refusing writes: {e}"
                    );
                    refuse = Some(WriteRefusal::RecoveryUnsealed {
                        segment: id,
                        detail: e.to_string(),
                    });
                }
            }
        }
        for (id, why) in &report.quarantined {
            tracing::warn!(segment = id, "quarantined: {why}");
        }
        Stats::add(&stats.open_bytes_read, report.bytes_read);
        Stats::add(&stats.open_payload_bytes, report.payload_bytes);
        Stats::add(&stats.torn_tails_truncated, report.torn_tails.len() as u64);
        Stats::add(&stats.corrupt_records, report.corrupt_records.len() as u64);
        Stats::add(&stats.quarantined_segments, report.quarantined.len() as u64);
        let quarantined = report.quarantined.iter().map(|(id, _)| *id).collect();
        let dram = DramTier::new(config.dram_bytes);
        let read_marks = ReadMarks::new(config.ssd_bytes.is_some());
        let superseded = Superseded::default();
        for (key, segment) in &rec_superseded {
            superseded.note(key, *segment);
        }
        let retired = manifest
            .state
            .snapshot
            .namespaces
            .iter()
            .filter_map(|(ns, st)| st.retired_below.map(|w| (*ns, w)))
            .collect();
        let store = Self {
            io,
            layout,
            config,
            directory_id: header.directory_id,
            _lock: lock,
            index,
            segments: RwLock::new(segments),
            quarantined: RwLock::new(quarantined),
            writer: Mutex::new(Writer {
                manifest,
                active: [None, None],
                next_sequence,
                refuse,
                no_space_at: None,
                lost_since_sync: 0,
                ssd_used: 0,
                probation: BTreeSet::new(),
                ghost: Ghost::default(),
            }),
            stats,
            report,
            dram,
            pins: Pins::default(),
            read_marks,
            superseded,
            retired: RwLock::new(retired),
        };
        {
            let mut w = store.writer();
            store.recount_used(&mut w);
        }
        Ok(store)
    }

    /// What recovery found when the store was opened.
    pub fn recovery_report(&self) -> &RecoveryReport {
        &self.report
    }

    /// Counters.
    pub fn stats(&self) -> StatsSnapshot {
        self.stats.snapshot()
    }

    /// How full the tiers are.
    pub fn usage(&self) -> Usage {
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
        let seq = w.next_sequence;
        w.manifest
            .append(seq, ManifestRecord::NamespaceRegistered { namespace, info })?;
        w.next_sequence += 1;
        Ok(())
    }

    /// Retires `namespace`: one durable manifest record whose sequence is the watermark; no record
    /// of the namespace older than it is served again. Returns the watermark.
    pub fn retire_namespace(&self, namespace: Namespace) -> Result<u64> {
        tracing::debug!(phase = "retire", step = "begin", namespace = %namespace);
        self.writable()?;
        let mut w = self.writer();
        Self::manifest_writable(&w)?;
        let seq = w.next_sequence;
        w.manifest.append(
            seq,
            ManifestRecord::NamespaceRetired {
                namespace,
                watermark: seq,
            },
        )?;
        w.next_sequence += 1;
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

    /// A new segment (for `log`'s appends, or for compaction output): the manifest names it
    /// durably before the file exists; blocks for a whole segment are reserved up front
    /// (released past the end when it is sealed; a disk too full for that still takes appends
    /// until it is truly full); its header is written and synced. A segment's id is its segment
    /// sequence, so ids are never reused.
    pub(crate) fn create_segment(&self, w: &mut Writer) -> Result<Active> {
        let seq = w
            .manifest
            .state
            .snapshot
            .last_segment_sequence
            .map_or(1, |s| s + 1);
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
        let mseq = w.next_sequence;
        w.manifest
            .append(mseq, ManifestRecord::SegmentCreated(created))?;
        w.next_sequence += 1;
        let path = self.layout.segment(id);
        let file = self
            .io
            .open(&path, OpenMode::CreateNew)
            .map_err(io_err(&path, "create segment"))?;
        let preallocated = file.preallocate(self.config.segment_bytes).is_ok();
        let seg = Arc::new(SegmentFile::new(id, path, file));
        let header = SegmentHeader {
            segment_id: id,
            sequence: seq,
            created_unix_ms: now_ms(),
            directory_id: self.directory_id,
            alignment: self.config.alignment,
            compression: created.compression,
        };
        let mut active = Active::create(header, seg, self.config.compression)?;
        active.preallocated = preallocated;
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
    fn seal_active(&self, w: &mut Writer, log: Log) -> Result<()> {
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
        let seq = w.next_sequence;
        w.manifest.append(
            seq,
            ManifestRecord::SegmentSealed(SegmentSealed {
                segment_id: id,
                footer_digest: digest,
                records,
                data_end,
            }),
        )?;
        w.next_sequence += 1;
        if w.manifest.wants_checkpoint(self.config.checkpoint_every) {
            let seq = w.next_sequence;
            w.next_sequence += 1;
            if let Err(e) = w.manifest.checkpoint(self.io.as_ref(), seq) {
                tracing::error!("manifest checkpoint failed, refusing writes: {e}");
                w.refuse = Some(WriteRefusal::CheckpointFailed {
                    detail: e.to_string(),
                });
                return Err(e);
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
    fn bundle_need(&self, records: &[(RecordMeta, &[u8])]) -> u64 {
        records
            .iter()
            .map(|(_, p)| (p.len() + FRAME_HEADER_LEN + self.config.alignment.unit()) as u64)
            .sum()
    }

    /// Makes sure `log` has an active segment with room for `need` more bytes (sealing a full
    /// one, starting a new one); returns its id.
    fn ensure_active(&self, w: &mut Writer, log: Log, need: u64) -> Result<u64> {
        let full = w.active[log as usize].as_ref().is_some_and(|a| {
            !a.entries.is_empty() && a.len + need + a.seal_overhead() > self.config.segment_bytes
        });
        if full {
            self.seal_active(w, log)?;
        }
        match w.active[log as usize].as_ref() {
            Some(a) => Ok(a.seg.id),
            None => self.start_segment(w, log),
        }
    }

    /// Which log a bundle goes to: with S3-FIFO, the main log when the ghost set remembers one
    /// of its keys, else probation; with the one-log policies, the main log.
    fn placement(&self, w: &mut Writer, records: &[(RecordMeta, &[u8])]) -> Log {
        if self.config.ssd_bytes.is_none() || self.config.policy != Policy::S3Fifo {
            return Log::Main;
        }
        let mut remembered = false;
        for (meta, _) in records {
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
            });
        }
        let mut prepared = self.prepare(records)?;
        let receipt = self.put_encoded(records, &mut prepared.enc, true);
        prepared.enc.recycle();
        receipt
    }

    /// Encodes a bundle of records for [`StateStore::put_prepared`]: the payload copy and CRC,
    /// done by the calling thread without the writer's lock, so that one thread encodes the
    /// next bundle while another appends the last. Refuses the bundle as [`StateStore::put`]
    /// would for its sizes.
    pub fn prepare(&self, records: &[(RecordMeta, &[u8])]) -> Result<Prepared> {
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
        Ok(Prepared {
            enc: Encoded::new(records, self.config.alignment, self.config.compression)?,
            records: records.len(),
        })
    }

    /// Appends a bundle [`StateStore::prepare`] encoded from exactly these `records`, as
    /// [`StateStore::put`] does. The DRAM tier keeps each payload's buffer itself rather than a
    /// copy: each `Vec` is left holding the memory of a copy the tier evicted (for the caller's
    /// next copy), or nothing, or its own bytes where the tier keeps no copy.
    pub fn put_prepared(
        &self,
        records: &mut [(&RecordMeta, &mut Vec<u8>)],
        mut prepared: Prepared,
    ) -> Result<PutReceipt> {
        if records.is_empty() {
            return self.put(&[]);
        }
        if prepared.records != records.len() {
            return Err(Error::BadBundle(format!(
                "{} records, prepared as {}",
                records.len(),
                prepared.records
            )));
        }
        let receipt = {
            let views: Vec<(RecordMeta, &[u8])> = records
                .iter()
                .map(|(m, b)| ((*m).clone(), b.as_slice()))
                .collect();
            let r = self.put_encoded(&views, &mut prepared.enc, false);
            prepared.enc.recycle_shared();
            r?
        };
        // After the writer's lock: a copy the tier holds is served only for the key and
        // sequence the index or a pin names, so it may arrive after its record is indexed.
        for (i, (meta, payload)) in records.iter_mut().enumerate() {
            self.dram
                .take(&meta.key, receipt.first_sequence + i as u64, payload);
        }
        Ok(receipt)
    }

    /// Appends `enc`, encoded from `records`; the DRAM tier copies each payload when `dram`.
    fn put_encoded(
        &self,
        records: &[(RecordMeta, &[u8])],
        enc: &mut Encoded,
        dram: bool,
    ) -> Result<PutReceipt> {
        let mut w = self.writer();
        self.check_writable(&mut w)?;
        for (meta, _) in records {
            if !w
                .manifest
                .state
                .snapshot
                .namespaces
                .contains_key(&meta.key.namespace)
            {
                return Err(Error::UnknownNamespace(meta.key.namespace));
            }
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
        let log = self.placement(&mut w, records);
        // An active segment a reader found unreadable is sealed off.
        for l in [Log::Probation, Log::Main] {
            if w.active[l as usize]
                .as_ref()
                .is_some_and(|a| self.is_quarantined(a.seg.id))
            {
                self.lose_unsynced(&mut w, l);
            }
        }
        let need = self.bundle_need(records);
        // Room for the bundle, and for a segment header and footer should it start one.
        let room = need + (SEGMENT_HEADER_LEN as u64) * 2 + self.config.alignment.unit() as u64;
        if let Err(e) = self.make_room(&mut w, room) {
            if matches!(e, Error::CapacityExhausted { .. }) {
                Stats::add(&self.stats.refused_puts, 1);
                return Err(e);
            }
            return Err(self.refuse_on(&mut w, e, log));
        }
        if let Err(e) = self.ensure_active(&mut w, log, need) {
            return Err(self.refuse_on(&mut w, e, log));
        }
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
        w.ssd_used += written;
        w.next_sequence += records.len() as u64;
        let durable = self.config.durability == Durability::EveryPut;
        if durable {
            self.sync_log(&mut w, log)?;
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
        Ok(PutReceipt {
            first_sequence: first,
            records: records.len(),
            durable,
        })
    }

    /// The failure policy for a write or segment-lifecycle error on `log`: no space refuses puts
    /// for [`NO_SPACE_RETRY`]; anything else seals `log`'s active segment off (the next put
    /// starts a new one).
    fn refuse_on(&self, w: &mut Writer, e: Error, log: Log) -> Error {
        Stats::add(&self.stats.refused_puts, 1);
        let no_space = matches!(&e, Error::Io { source, .. } if source.kind() == std::io::ErrorKind::StorageFull);
        if no_space {
            tracing::error!("no space left: refusing puts, still serving reads ({e})");
            w.no_space_at = Some(Instant::now());
        } else {
            tracing::error!("write failed: sealing the active segment off ({e})");
            self.lose_unsynced(w, log);
        }
        e
    }

    /// Indexes `rec` of `key` (newer wins); returns the record it replaced, noting where a
    /// superseded one still lies.
    fn index_record(&self, key: &StateKey, rec: Record) -> Result<Option<Record>> {
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
    fn sync_log(&self, w: &mut Writer, log: Log) -> Result<()> {
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

    /// How many keys of `chain`, from the first, are stored (one call).
    pub fn probe(&self, chain: &[StateKey]) -> usize {
        self.index.probe(chain)
    }

    pub(crate) fn is_quarantined(&self, id: u64) -> bool {
        self.quarantined
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .contains(&id)
    }

    /// Reads the record of `key` into `out` (replacing its contents), verified: from the DRAM
    /// tier when it holds a copy of exactly the indexed record, else from its segment, where the
    /// frame must carry exactly this key and the indexed sequence and its payload CRC must verify
    /// while it is copied. Returns the record, or `None` — a miss, never unverified bytes.
    pub fn get(&self, key: &StateKey, out: &mut Vec<u8>) -> Result<Option<Record>> {
        Stats::add(&self.stats.gets, 1);
        let miss = |this: &Self| {
            Stats::add(&this.stats.misses, 1);
            Ok(None)
        };
        let Some(rec) = self.index.get(key) else {
            return miss(self);
        };
        let id = u64::from(rec.segment);
        if self.dram.get(key, rec.sequence, out) {
            self.read_marks.mark(id, rec.offset);
            Stats::add(&self.stats.dram_hits, 1);
            Stats::add(&self.stats.hits, 1);
            return Ok(Some(rec));
        }
        if self.is_quarantined(id) {
            return miss(self);
        }
        let Some(seg) = self.segment_file(id) else {
            return miss(self);
        };
        if !self.read_verified(&seg, key, &rec, Sink::Buffer(out), true) {
            return miss(self);
        }
        self.read_marks.mark(id, rec.offset);
        self.dram.insert(key, rec.sequence, out);
        Stats::add(&self.stats.hits, 1);
        Ok(Some(rec))
    }

    /// Reads `rec` of `key` from `seg` into `out` and verifies it (key, sequence, CRC fused with
    /// the copy). On failure it counts it and, when `index` is set, drops the record from the
    /// index (bad bytes) or quarantines the segment (an I/O error); `out` is left empty.
    pub(crate) fn read_verified(
        &self,
        seg: &SegmentFile,
        key: &StateKey,
        rec: &Record,
        mut out: Sink<'_>,
        index: bool,
    ) -> bool {
        let id = seg.id;
        let len = FRAME_HEADER_LEN + rec.stored_len as usize;
        // A frame on a 4 KiB boundary (every frame of a direct segment) is read as whole blocks
        // into an aligned buffer, so the read can bypass the page cache. The buffer is the
        // thread's own, reused: no allocation or page faults per read.
        let want = if rec.offset.is_multiple_of(DIRECT_ALIGN as u64) {
            len.next_multiple_of(DIRECT_ALIGN)
        } else {
            len
        };
        let verify = |frame: &[u8], out: &mut Sink<'_>| {
            indexed_header(frame, key, rec).and_then(|h| {
                out.whole(|v| h.append_payload(&frame[FRAME_HEADER_LEN..], v, rec.offset))
            })
        };
        // Still in the active segment's write-behind tail, or (most often) in the file.
        let in_tail = seg.with_pending(rec.offset, len, |frame| verify(frame, &mut out));
        let (read, verified) = match in_tail {
            Some(verified) => (Ok(()), verified),
            None => READ_BUF.with_borrow_mut(|(buf, pad)| {
                if buf.len() < *pad + want {
                    (*buf, *pad) = aligned_buffer(want);
                }
                let region = &mut buf[*pad..*pad + want];
                // Checked and copied chunk by chunk as the chunks arrive (overlapping the
                // device's transfer of the next ones where the backend reads asynchronously).
                let mut stream = Streamed::new(key, rec, len, &mut out);
                if let Err(e) =
                    seg.file
                        .read_chunked(region, rec.offset, len, READ_CHUNK, &mut |bytes| {
                            stream.take(bytes)
                        })
                {
                    return (Err(e), Ok(()));
                }
                let verified = match stream.finish() {
                    Some(v) => v,
                    // Compressed: checked and decompressed whole, now that it is all in.
                    None => verify(&region[..len], &mut out),
                };
                if buf.len() > MAX_KEPT_READ_BUF {
                    // A rare huge frame: not worth keeping its buffer for the thread's life.
                    (*buf, *pad) = (Vec::new(), 0);
                }
                (Ok(()), verified)
            }),
        };
        if let Err(e) = &read
            && e.kind() == std::io::ErrorKind::UnexpectedEof
        {
            // The file is shorter than the record: that record is gone, not the segment.
            Stats::add(&self.stats.checksum_failures, 1);
            if index {
                self.index.remove(key, Some(rec.sequence));
            }
            out.clear();
            return false;
        }
        if let Err(e) = read {
            Stats::add(&self.stats.read_errors, 1);
            tracing::error!(segment = id, "read failed, quarantining the segment: {e}");
            if index
                && self
                    .quarantined
                    .write()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(id)
            {
                Stats::add(&self.stats.quarantined_segments, 1);
            }
            out.clear();
            return false;
        }
        if let Err(e) = verified {
            Stats::add(&self.stats.checksum_failures, 1);
            tracing::warn!(
                segment = id,
                offset = rec.offset,
                "record failed verification, dropped: {e}"
            );
            if index {
                self.index.remove(key, Some(rec.sequence));
            }
            out.clear();
            return false;
        }
        true
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

    /// Seals the active segment and closes, so the next open reads footers only. Dropping the
    /// store without `close` leaves the active segment to be scanned (and sealed) on next open.
    pub fn close(self) -> Result<()> {
        let mut w = self.writer();
        let a = self.seal_active(&mut w, Log::Probation);
        let b = self.seal_active(&mut w, Log::Main);
        a.and(b)
    }
}

/// The header at the start of `frame`, verified and checked to name the record the index
/// points at (`key`, `rec`'s sequence).
fn indexed_header(
    frame: &[u8],
    key: &StateKey,
    rec: &Record,
) -> orbitkv_segments::Result<FrameHeader> {
    let h = FrameHeader::decode(frame, rec.offset)?;
    let same_key = matches!(&h.body, FrameBody::Record(m) if m.key == *key);
    if !same_key || h.record_sequence != rec.sequence {
        return Err(orbitkv_segments::Error::InvalidField {
            what: "frame",
            offset: rec.offset,
            field: "key/sequence",
            reason: "differs from the index".to_owned(),
        });
    }
    Ok(h)
}

/// Chunk size of verified reads: a chunk is checked and copied while later ones are in flight.
const READ_CHUNK: usize = 256 << 10;

/// Where a verified read puts the payload.
pub(crate) enum Sink<'a> {
    /// The whole payload, in a buffer (cleared first).
    Buffer(&'a mut Vec<u8>),
    /// Payload bytes `from..from + dst.len()` of a payload of exactly `len` bytes, into memory
    /// the caller owns (a device pool's pinned staging buffer): filled straight from the read,
    /// the rest of the payload checked and not kept. After a failed read `dst` holds nothing
    /// usable.
    Part {
        /// The payload's length, as the caller's geometry says it must be.
        len: usize,
        /// The first payload byte wanted.
        from: usize,
        /// Where the wanted bytes go.
        dst: &'a mut [u8],
    },
}

impl Sink<'_> {
    /// Forgets what a failed read left.
    fn clear(&mut self) {
        if let Sink::Buffer(v) = self {
            v.clear();
        }
    }

    /// Delivers a payload produced whole by `produce` (a frame still in the write-behind tail,
    /// or a compressed one): into the buffer, or through a scratch buffer into `dst`.
    fn whole(
        &mut self,
        produce: impl FnOnce(&mut Vec<u8>) -> orbitkv_segments::Result<()>,
    ) -> orbitkv_segments::Result<()> {
        match self {
            Sink::Buffer(v) => produce(v),
            Sink::Part { len, from, dst } => {
                let mut whole = Vec::new();
                produce(&mut whole)?;
                Self::check(*len, *from, dst.len(), whole.len())?;
                let part = whole.get(*from..*from + dst.len()).ok_or_else(|| {
                    orbitkv_segments::Error::Usage("range past the payload".into())
                })?;
                dst.copy_from_slice(part);
                Ok(())
            }
        }
    }

    /// Takes payload bytes `bytes` that start at payload position `at`, folding each into the
    /// running checksum `crc` in payload order — the kept ones as they lie where they were put.
    fn take(&mut self, at: usize, bytes: &[u8], crc: u32) -> u32 {
        use orbitkv_segments::crc::crc32c_append;
        match self {
            Sink::Buffer(v) => {
                let old = v.len();
                v.extend_from_slice(bytes);
                crc32c_append(crc, &v[old..])
            }
            Sink::Part { from, dst, .. } => {
                let end = at + bytes.len();
                let lo = (*from).clamp(at, end);
                let hi = (*from + dst.len()).clamp(at, end);
                let mut crc = crc32c_append(crc, &bytes[..lo - at]);
                if hi > lo {
                    let kept = &mut dst[lo - *from..hi - *from];
                    kept.copy_from_slice(&bytes[lo - at..hi - at]);
                    crc = crc32c_append(crc, kept);
                }
                crc32c_append(crc, &bytes[hi - at..])
            }
        }
    }

    /// Checks that a payload of `got` bytes is what the sink expects and holds what it wants.
    fn check_len(&self, got: usize) -> orbitkv_segments::Result<()> {
        match self {
            Sink::Buffer(_) => Ok(()),
            Sink::Part { len, from, dst } => Self::check(*len, *from, dst.len(), got),
        }
    }

    fn check(len: usize, from: usize, want: usize, got: usize) -> orbitkv_segments::Result<()> {
        if got != len || from.checked_add(want).is_none_or(|end| end > len) {
            return Err(orbitkv_segments::Error::Usage(format!(
                "{want} bytes from byte {from} of a {len}-byte payload asked of a {got}-byte one"
            )));
        }
        Ok(())
    }
}

/// A frame verified as its bytes arrive: the header from the first chunk (key and sequence
/// checked against the index), then the payload delivered to `out` and checksummed chunk by
/// chunk while still in cache. Compressed frames are left to the whole-frame path.
struct Streamed<'a, 's> {
    key: &'a StateKey,
    rec: &'a Record,
    len: usize,
    out: &'a mut Sink<'s>,
    /// Payload bytes taken so far.
    payload: usize,
    seen: usize,
    header: Option<std::result::Result<FrameHeader, orbitkv_segments::Error>>,
    head: Vec<u8>,
    crc: u32,
}

impl<'a, 's> Streamed<'a, 's> {
    fn new(key: &'a StateKey, rec: &'a Record, len: usize, out: &'a mut Sink<'s>) -> Self {
        out.clear();
        Self {
            key,
            rec,
            len,
            out,
            payload: 0,
            seen: 0,
            header: None,
            head: Vec::new(),
            crc: 0,
        }
    }

    fn take(&mut self, bytes: &[u8]) {
        let mut bytes = &bytes[..bytes.len().min(self.len.saturating_sub(self.seen))];
        if self.header.is_none() {
            let need = FRAME_HEADER_LEN - self.head.len();
            let n = need.min(bytes.len());
            self.head.extend_from_slice(&bytes[..n]);
            self.seen += n;
            bytes = &bytes[n..];
            if self.head.len() < FRAME_HEADER_LEN {
                return;
            }
            let h = indexed_header(&self.head, self.key, self.rec);
            if let Ok(h) = &h
                && !h.compressed
                && let Sink::Buffer(v) = self.out
            {
                v.reserve(h.stored_len as usize);
            }
            self.header = Some(h);
        }
        if let Some(Ok(h)) = &self.header
            && !h.compressed
            && !bytes.is_empty()
        {
            self.crc = self.out.take(self.payload, bytes, self.crc);
            self.payload += bytes.len();
        }
        self.seen += bytes.len();
    }

    /// The verdict, or `None` for a compressed frame (verified whole by the caller).
    fn finish(self) -> Option<orbitkv_segments::Result<()>> {
        let r = match self.header {
            None => Err(orbitkv_segments::Error::Usage(
                "frame shorter than its header".into(),
            )),
            Some(Err(e)) => Err(e),
            Some(Ok(h)) if h.compressed => return None,
            Some(Ok(h)) => {
                if self.payload != h.stored_len as usize {
                    Err(orbitkv_segments::Error::Usage("frame ends early".into()))
                } else {
                    self.out
                        .check_len(self.payload)
                        .and_then(|()| h.check_payload_crc(self.crc, self.rec.offset))
                }
            }
        };
        if r.is_err() {
            self.out.clear();
        }
        Some(r)
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
