//! Opening a store: configuration checks, the directory lock, recovery, and the sealing of
//! what was active.
//!
//! A read-only open changes nothing on disk and refuses puts.
//! A recovered active segment that cannot be sealed leaves the store open for reads only.

use std::collections::{BTreeSet, HashSet};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{SystemTime, UNIX_EPOCH};

use orbitkv_index::Index;
use orbitkv_segments::Alignment;
use orbitkv_wal::{ManifestRecord, SegmentSealed};

use crate::active::Active;
use crate::admission::Admission;
use crate::dir::{self, Layout};
use crate::dram::DramTier;
use crate::error::{Error, Result, WriteRefusal, io_err};
use crate::ghost::Ghost;
use crate::io::Io;
use crate::manifest::Manifest;
use crate::pins::Pins;
use crate::recency::Recency;
use crate::reclaimer::{Policy, ReadMarks};
use crate::recover::{self, RecoveryReport};
use crate::stats::Stats;
use crate::superseded::Superseded;
use crate::{
    MAX_SEGMENT_BYTES, MIN_SSD_BYTES, RECORD_LRU_SEGMENTS_PER_BUDGET, SEGMENTS_PER_BUDGET,
    StateStore, StoreConfig, Writer,
};

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
            let per_budget = match config.policy {
                Policy::RecordLru => RECORD_LRU_SEGMENTS_PER_BUDGET,
                _ => SEGMENTS_PER_BUDGET,
            };
            // An evicted record's space is freed by punching its pages out: its frame must
            // own them.
            if config.policy == Policy::RecordLru {
                config.alignment = Alignment::Direct;
            }
            config.segment_bytes = config.segment_bytes.min(budget / per_budget).max(8 << 10);
        }
        if !config.read_only {
            io.create_dir_all(&layout.segments())
                .map_err(io_err(&layout.segments(), "create directory"))?;
        }
        let lock = dir::lock(io.as_ref(), &layout, config.read_only)?;
        if config.read_only && !io.exists(&layout.header()) {
            return Err(Error::Damaged {
                path: layout.root.clone(),
                reason: "no store here (no orbitkv.dir)".to_owned(),
            });
        }
        let (header, _) = dir::open_header(io.as_ref(), &layout, now_ms(), random_id())?;
        let opened = Manifest::open(io.as_ref(), &layout, config.read_only)?;
        let manifest = opened.manifest;
        let stats = Stats::default();
        let index = Index::with_capacity(config.index_capacity);
        let recency =
            Recency::new(config.policy == Policy::RecordLru && config.ssd_bytes.is_some());
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
            (&index, &recency),
            report,
        )?;
        let report = rec.report;
        let rec_superseded = rec.superseded;
        let highest = rec.max_record_sequence.max(manifest.state.last_sequence);
        let next_sequence = highest.map_or(1, |s| s.saturating_add(1));
        let exhausted = highest
            .filter(|&s| s >= crate::SEQUENCE_LIMIT)
            .map(|highest| WriteRefusal::SequencesExhausted { highest });
        let mut segments = rec.segments;
        let mut writer = Writer {
            manifest,
            active: [None, None],
            next_sequence,
            refuse: config
                .read_only
                .then_some(WriteRefusal::ReadOnly)
                .or(exhausted),
            no_space_at: None,
            lost_since_sync: 0,
            ssd_used: 0,
            probation: BTreeSet::new(),
            ghost: Ghost::default(),
            spare: None,
            punched: rec.punched,
            punch_unsupported: false,
            punch_checked: false,
            unsynced_punches: BTreeSet::new(),
        };
        // Seal what was active (or forget it when empty): recovery scans only one active tail.
        // If that cannot be written (a full disk), the store still opens and serves reads.
        // A store refusing writes from the start (read-only, sequences exhausted) writes
        // nothing here either: its actives stay as they are.
        let actives = if writer.refuse.is_some() {
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
                        writer
                            .append_manifest(ManifestRecord::SegmentSealed(SegmentSealed {
                                segment_id: id,
                                footer_digest: digest,
                                records: active.entries.len() as u64,
                                data_end,
                            }))
                            .map(drop)
                    })
                }
                other => writer
                    .append_manifest(ManifestRecord::SegmentDeleted { segment_id: id })
                    .map(|_| {
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
                Ok(()) => {}
                Err(e) => {
                    tracing::error!(
                        segment = id,
                        "cannot seal a recovered segment, refusing writes: {e}"
                    );
                    writer.refuse = Some(WriteRefusal::RecoveryUnsealed {
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
        let admission = match (config.policy, config.ssd_bytes, config.read_only) {
            (Policy::RecordLru, Some(budget), false) => {
                Admission::new(budget, config.admission.waiting_bytes())
            }
            _ => Admission::new(0, None),
        };
        let read_marks = ReadMarks::new(config.ssd_bytes.is_some());
        // Recovered records are ordered by sequence, older first, below every use to come.
        recency.start_at(next_sequence);
        let superseded = Superseded::default();
        for (key, segment) in &rec_superseded {
            superseded.note(key, *segment);
        }
        let retired = writer
            .manifest
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
            uncompactable: Mutex::new(HashSet::new()),
            writer: Mutex::new(writer),
            stats,
            report,
            dram,
            admission,
            pins: Pins::default(),
            read_marks,
            recency,
            superseded,
            retired: RwLock::new(retired),
        };
        {
            let mut w = store.writer();
            // A spare kept before the restart is reused, or removed where the store no longer
            // recycles or its segments are now much smaller (crate::spare); a read-only store
            // leaves it alone.
            if !store.config.read_only
                && let Some(size) = store.find_spare()
            {
                if store.recycles() && store.fits_spare(size) {
                    w.spare = Some(size);
                } else {
                    store.remove_segment_file(&store.layout.spare_segment());
                }
            }
            store.recount_used(&mut w);
        }
        Ok(store)
    }
}
