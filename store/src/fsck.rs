//! `fsck`: a read-only check of a whole store — the data-directory header, the manifest, every
//! record of every segment (CRCs verified; sealed segments scanned strictly and compared with
//! their footers), orphan files, records of retired namespaces — and a repair that truncates torn
//! tails, rewrites segments holding bad records or unreadable footers with only their good
//! records, and removes orphan files.

use std::path::PathBuf;
use std::sync::Arc;

use orbitkv_segments::{
    FrameBody, IndexEntry, STORE_FORMAT_VERSION, ScanItem, ScanMode, Scanner, SegmentHeader,
    StopReason, TRAILER_LEN, Trailer,
};
use orbitkv_wal::{ReplayStop, SegmentState, replay};

use crate::dir::{Layout, open_header};
use crate::error::{Error, Result, io_err};
use crate::io::{Io, OpenMode};
use crate::manifest::MAX_MANIFEST_BYTES;
use crate::recover::{MAX_SEGMENT_FILE_BYTES, is_punched, read_whole};
use crate::{StateStore, StoreConfig};

/// What was found in one segment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SegmentCheck {
    /// Segment id.
    pub id: u64,
    /// Sealed (else active).
    pub sealed: bool,
    /// Valid frames.
    pub frames: u64,
    /// Records (and tombstones) among them.
    pub records: u64,
    /// Bad records: (offset, what was wrong).
    pub bad_records: Vec<(u64, String)>,
    /// An active segment's torn tail: the valid length it would be truncated to.
    pub torn_tail: Option<u64>,
    /// A header, trailer or footer that does not verify (the segment is quarantined on open).
    pub unreadable: Option<String>,
    /// The footer disagrees with the frames.
    pub footer_mismatch: Option<String>,
    /// Records the footer lists that were punched out (evicted under the `lru` policy): not
    /// damage.
    pub punched: u64,
}

/// What `fsck` found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FsckReport {
    /// The data directory.
    pub data_dir: PathBuf,
    /// An incompatible store: (version found, version supported).
    pub incompatible: Option<(u32, u32)>,
    /// The header or manifest is damaged beyond repair (nothing else was checked).
    pub fatal: Option<String>,
    /// Manifest records replayed.
    pub manifest_records: u64,
    /// The manifest's torn tail (repairable: it is truncated).
    pub manifest_torn_tail: Option<String>,
    /// Segments checked.
    pub segments: Vec<SegmentCheck>,
    /// Segment files no manifest record names.
    pub orphans: Vec<String>,
    /// Records in the segments (all, including dead ones).
    pub records: u64,
    /// Records of retired namespaces below their watermark (dead, not a problem).
    pub retired_records: u64,
    /// Bytes read.
    pub bytes_read: u64,
}

impl FsckReport {
    /// One line per problem.
    pub fn problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        if let Some((found, supported)) = self.incompatible {
            out.push(format!(
                "incompatible store format {found} (this build reads {supported})"
            ));
        }
        if let Some(f) = &self.fatal {
            out.push(f.clone());
        }
        if let Some(t) = &self.manifest_torn_tail {
            out.push(format!("manifest: torn tail ({t})"));
        }
        for s in &self.segments {
            if let Some(u) = &s.unreadable {
                out.push(format!("segment {}: unreadable ({u})", s.id));
            }
            if let Some(m) = &s.footer_mismatch {
                out.push(format!("segment {}: footer mismatch ({m})", s.id));
            }
            if let Some(v) = s.torn_tail {
                out.push(format!(
                    "segment {}: torn tail (valid up to byte {v})",
                    s.id
                ));
            }
            for (off, why) in &s.bad_records {
                out.push(format!(
                    "segment {}: bad record at byte {off} ({why})",
                    s.id
                ));
            }
        }
        for o in &self.orphans {
            out.push(format!("orphan segment file {o}"));
        }
        out
    }

    /// True when nothing is wrong.
    pub fn is_clean(&self) -> bool {
        self.problems().is_empty()
    }

    /// True when `repair` can fix every problem (only the manifest's body and an incompatible
    /// version cannot be repaired in place).
    pub fn repairable(&self) -> bool {
        self.fatal.is_none() && self.incompatible.is_none()
    }
}

fn entries_match(scanned: &[IndexEntry], footer: &[IndexEntry]) -> Option<String> {
    if scanned.len() != footer.len() {
        return Some(format!(
            "{} frames, the footer lists {}",
            scanned.len(),
            footer.len()
        ));
    }
    scanned
        .iter()
        .zip(footer)
        .find(|(a, b)| a != b)
        .map(|(a, _)| format!("frame at byte {} differs from its entry", a.offset))
}

/// Checks the store in `data_dir` without changing it. The directory is locked meanwhile, so a
/// live store is refused. `progress(done, total)` is called as segment bytes are read.
pub fn check(
    io: &dyn Io,
    data_dir: &std::path::Path,
    progress: &dyn Fn(u64, u64),
) -> Result<FsckReport> {
    let layout = Layout::new(data_dir);
    let mut report = FsckReport {
        data_dir: data_dir.to_owned(),
        ..FsckReport::default()
    };
    if !io.exists(&layout.header()) && !io.exists(&layout.manifest()) {
        return Err(Error::Damaged {
            path: data_dir.to_owned(),
            reason: "no store here (no orbitkv.dir)".to_owned(),
        });
    }
    let _lock = crate::dir::lock(io, &layout, true)?;
    let header = match open_header(io, &layout, 0, [0; 16]) {
        Ok((h, _)) => h,
        Err(Error::IncompatibleStore {
            found, supported, ..
        }) => {
            report.incompatible = Some((found, supported));
            return Ok(report);
        }
        Err(e) => {
            report.fatal = Some(e.to_string());
            return Ok(report);
        }
    };
    let mpath = layout.manifest();
    let mfile = io
        .open(&mpath, OpenMode::Read)
        .map_err(io_err(&mpath, "open"))?;
    let mbytes = match read_whole(mfile.as_ref(), MAX_MANIFEST_BYTES) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::FileTooLarge => {
            report.fatal = Some(format!("manifest: {e}: not repairable in place"));
            return Ok(report);
        }
        Err(e) => return Err(io_err(&mpath, "read")(e)),
    };
    report.bytes_read += mbytes.len() as u64;
    let r = replay(&mbytes);
    report.manifest_records = r.records;
    match r.stop {
        ReplayStop::CleanEnd => {}
        ReplayStop::TornTail { error } => report.manifest_torn_tail = Some(error.to_string()),
        ReplayStop::Corrupt {
            error,
            next_valid_at,
        } => {
            report.fatal = Some(format!(
                "manifest corrupt at byte {} ({error}; a valid record follows at {next_valid_at}): not repairable in place",
                r.valid_len
            ));
            return Ok(report);
        }
        ReplayStop::DamagedStart { error } => {
            report.fatal = Some(format!(
                "manifest's first record is damaged ({error}) and was written whole, so it is not a torn tail: not repairable in place"
            ));
            return Ok(report);
        }
        ReplayStop::Invalid { error } => {
            report.fatal = Some(format!(
                "manifest holds a contradictory record ({error}): not repairable in place"
            ));
            return Ok(report);
        }
    }
    let state = r.state;
    let listed: Vec<(u64, SegmentState)> = state
        .snapshot
        .segments
        .iter()
        .map(|(id, st)| (*id, *st))
        .collect();
    // For progress only: a file that cannot be sized or is too large to read counts 0.
    let total: u64 = listed
        .iter()
        .map(|(id, _)| {
            io.open(&layout.segment(*id), OpenMode::Read)
                .and_then(|f| f.size())
                .ok()
                .filter(|&size| size <= MAX_SEGMENT_FILE_BYTES)
                .unwrap_or(0)
        })
        .sum();
    let mut done = 0u64;
    for (id, st) in listed {
        let mut c = SegmentCheck {
            id,
            sealed: matches!(st, SegmentState::Sealed(..)),
            ..SegmentCheck::default()
        };
        let path = layout.segment(id);
        let mut holes = Vec::new();
        let bytes = match io.open(&path, OpenMode::Read).and_then(|f| {
            holes = f.holes()?;
            read_whole(f.as_ref(), MAX_SEGMENT_FILE_BYTES)
        }) {
            Ok(b) => b,
            Err(e) => {
                if e.kind() != std::io::ErrorKind::NotFound || c.sealed {
                    c.unreadable = Some(format!("cannot read: {e}"));
                }
                report.segments.push(c);
                continue;
            }
        };
        report.bytes_read += bytes.len() as u64;
        done += bytes.len() as u64;
        progress(done, total.max(done));
        let seg_header = match SegmentHeader::decode(&bytes) {
            Ok(h) if h.segment_id == id && h.directory_id == header.directory_id => h,
            Ok(_) => {
                c.unreadable = Some("header names another segment or directory".to_owned());
                report.segments.push(c);
                continue;
            }
            Err(e) if !c.sealed && bytes.len() < 4096 => {
                let _ = e; // created, header never durable: an empty active segment
                report.segments.push(c);
                continue;
            }
            Err(e) => {
                c.unreadable = Some(format!("header: {e}"));
                report.segments.push(c);
                continue;
            }
        };
        let (region, footer_entries) = if let SegmentState::Sealed(_, sealed) = st {
            let len = bytes.len() as u64;
            let tail = bytes
                .get(bytes.len().saturating_sub(TRAILER_LEN)..)
                .unwrap_or_default();
            match Trailer::decode(tail, len).and_then(|t| {
                let f = bytes
                    .get(t.footer_offset as usize..(t.footer_offset + t.footer_len) as usize)
                    .unwrap_or_default();
                t.open_footer(f, seg_header.alignment).map(|foot| (t, foot))
            }) {
                Ok((t, foot)) if t.footer_digest == sealed.footer_digest => {
                    (t.footer_offset as usize, Some(foot.entries))
                }
                Ok(_) => {
                    c.unreadable =
                        Some("footer digest differs from the manifest's seal record".to_owned());
                    (bytes.len(), None)
                }
                Err(e) => {
                    c.unreadable = Some(format!("trailer/footer: {e}"));
                    (bytes.len(), None)
                }
            }
        } else {
            (bytes.len(), None)
        };
        let mode = if c.sealed && footer_entries.is_some() {
            ScanMode::Strict
        } else {
            ScanMode::TolerateTail
        };
        // The footer's entries punched out, by offset.
        let punched: Vec<u64> = footer_entries
            .iter()
            .flatten()
            .filter(|e| is_punched(e, &holes))
            .map(|e| e.offset)
            .collect();
        c.punched = punched.len() as u64;
        // Bad bytes at `from..to` are punched records when the footer lists frames there, each
        // punched.
        let explained = |from: u64, to: u64| {
            let listed = footer_entries
                .iter()
                .flatten()
                .filter(|e| e.offset >= from && e.offset < to);
            let mut any = false;
            for e in listed {
                if punched.binary_search(&e.offset).is_err() {
                    return false;
                }
                any = true;
            }
            any && punched.binary_search(&from).is_ok()
        };
        let mut scanner = Scanner::new(&bytes[..region], seg_header, mode);
        let mut scanned = Vec::new();
        for item in scanner.by_ref() {
            match item {
                ScanItem::Frame(f) => {
                    c.frames += 1;
                    if !matches!(f.header.body, FrameBody::Padding) {
                        c.records += 1;
                        if let FrameBody::Record(m) = &f.header.body
                            && state.is_retired(&m.key.namespace, f.header.record_sequence)
                        {
                            report.retired_records += 1;
                        }
                        scanned.push(IndexEntry::from_frame(f.offset, &f.header));
                    }
                }
                ScanItem::Corrupt {
                    offset,
                    error,
                    resumed_at,
                } => {
                    if !explained(offset, resumed_at) {
                        c.bad_records.push((offset, error.to_string()));
                    }
                }
            }
        }
        match scanner.end().map(|e| (e.reason.clone(), e.valid_len)) {
            Some((StopReason::TornTail { .. }, valid)) if !c.sealed => c.torn_tail = Some(valid),
            Some((StopReason::Corrupt { .. }, valid)) if explained(valid, region as u64) => {}
            Some((StopReason::Corrupt { error }, valid)) => {
                c.bad_records
                    .push((valid, format!("the data region ends in damage: {error}")));
            }
            _ => {}
        }
        if let Some(entries) = &footer_entries
            && c.bad_records.is_empty()
        {
            let kept: Vec<IndexEntry> = entries
                .iter()
                .filter(|e| punched.binary_search(&e.offset).is_err())
                .cloned()
                .collect();
            c.footer_mismatch = entries_match(&scanned, &kept);
        }
        report.records += c.records;
        report.segments.push(c);
    }
    let names: Vec<String> = state
        .snapshot
        .segments
        .keys()
        .filter_map(|id| Some(layout.segment(*id).file_name()?.to_str()?.to_owned()))
        .collect();
    if let Ok(files) = io.list_dir(&layout.segments()) {
        report.orphans = files
            .into_iter()
            .filter(|f| f.ends_with(".seg") && !names.contains(f))
            .collect();
    }
    Ok(report)
}

/// What `repair` did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RepairReport {
    /// Torn tails truncated (manifest and active segments), as open reported them.
    pub torn_tails_truncated: usize,
    /// Segments rewritten with only their good records.
    pub segments_rewritten: Vec<u64>,
    /// Bad records dropped.
    pub bad_records_dropped: u64,
    /// Orphan files removed.
    pub orphans_removed: Vec<String>,
    /// Orphan files that could not be removed: (name, why). A later check finds them again.
    pub orphans_not_removed: Vec<(String, String)>,
    /// Why the segments directory could not be synced after the removals, if it could not:
    /// removed files may then come back after a power loss (a later check finds them again).
    pub dir_sync_failed: Option<String>,
}

/// Repairs what `report` (from [`check`]) found: opens the store (which truncates torn tails and
/// seals active segments), rewrites segments holding bad records or unreadable footers with their
/// good records, and removes orphan files. Refuses what cannot be repaired in place.
pub fn repair(io: Arc<dyn Io>, config: StoreConfig, report: &FsckReport) -> Result<RepairReport> {
    if !report.repairable() {
        return Err(Error::Damaged {
            path: config.data_dir.clone(),
            reason: report.problems().join("; "),
        });
    }
    let layout = Layout::new(&config.data_dir);
    let store = StateStore::open(io.clone(), config)?;
    let mut out = RepairReport {
        torn_tails_truncated: store.recovery_report().torn_tails.len()
            + usize::from(store.recovery_report().manifest_truncated),
        ..RepairReport::default()
    };
    let damaged: Vec<u64> = report
        .segments
        .iter()
        .filter(|s| {
            !s.bad_records.is_empty() || s.unreadable.is_some() || s.footer_mismatch.is_some()
        })
        .map(|s| s.id)
        .collect();
    if !damaged.is_empty() {
        let r = store.salvage(&damaged)?;
        out.segments_rewritten = r.inputs;
        out.bad_records_dropped = r.dropped_bad;
    }
    store.close()?;
    for name in &report.orphans {
        let p = layout.segments().join(name);
        match io.remove_file(&p) {
            Ok(()) => out.orphans_removed.push(name.clone()),
            Err(e) => {
                tracing::error!(path = %p.display(), "cannot remove an orphan file: {e}");
                out.orphans_not_removed.push((name.clone(), e.to_string()));
            }
        }
    }
    if let Err(e) = io.sync_dir(&layout.segments()) {
        tracing::error!(
            path = %layout.segments().display(),
            "cannot fsync the segments directory after repair: {e}"
        );
        out.dir_sync_failed = Some(e.to_string());
    }
    Ok(out)
}

/// Starts an incompatible store over, empty: removes its manifest, segments and header.
pub fn discard_incompatible(io: &dyn Io, data_dir: &std::path::Path) -> Result<()> {
    let layout = Layout::new(data_dir);
    let _lock = io
        .lock_exclusive(&layout.lock())
        .map_err(|_| Error::Locked {
            path: data_dir.to_owned(),
        })?;
    if let Ok(files) = io.list_dir(&layout.segments()) {
        for f in files {
            let p = layout.segments().join(f);
            io.remove_file(&p).map_err(io_err(&p, "remove"))?;
        }
    }
    for p in [layout.manifest(), layout.header()] {
        if io.exists(&p) {
            io.remove_file(&p).map_err(io_err(&p, "remove"))?;
        }
    }
    io.sync_dir(&layout.segments())
        .map_err(io_err(&layout.segments(), "fsync directory"))?;
    io.sync_dir(&layout.root)
        .map_err(io_err(&layout.root, "fsync directory"))?;
    tracing::warn!(
        version = STORE_FORMAT_VERSION,
        "incompatible store discarded; it starts empty"
    );
    Ok(())
}
