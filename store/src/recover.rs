//! Recovery on open: replay the manifest; open sealed segments from their trailers and footers
//! alone (no payload reads); scan only the active segment, truncating a torn tail and keeping
//! every valid record after a corrupt one; quarantine a sealed segment only when its header or
//! footer fails verification; rebuild the index; report all of it.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use orbitkv_index::{Index, Insert, Record, Tier};
use orbitkv_segments::footer::{FOOTER_FIXED_LEN, INDEX_ENTRY_LEN, NAMESPACE_SUMMARY_LEN};
use orbitkv_segments::segment_header::DIRECT_ALIGN;
use orbitkv_segments::{
    FRAME_HEADER_LEN, FrameBody, IndexEntry, MAX_PAYLOAD_LEN, ScanItem, ScanMode, Scanner,
    SegmentHeader, StopReason, TRAILER_LEN,
};
use orbitkv_state::StateKey;
use orbitkv_wal::{ManifestState, SegmentCreated, SegmentState};

use crate::active::{SegmentFile, read_sealed};
use crate::dir::Layout;
use crate::error::{Result, io_err};
use crate::io::{Io, IoFile, OpenMode};
use crate::recency::Recency;

/// Bytes read at a time when a file is read whole (the manifest, an active segment on open,
/// every segment in fsck and repair).
pub(crate) const WHOLE_READ_CHUNK: usize = 8 << 20;

/// The largest segment file read whole; a larger one is damaged (a sparse or runaway file) and
/// is reported without being read. Frames start at most at the index's largest offset, each at
/// most a frame header, the largest payload and an alignment unit long. The footer lists each
/// frame, of at least a frame header's length, with one entry and at most one namespace summary.
/// The store's own segments stay far below this: at most [`crate::MAX_SEGMENT_BYTES`], or one
/// bundle with its footer where a single bundle is larger.
pub const MAX_SEGMENT_FILE_BYTES: u64 = {
    let data =
        orbitkv_index::MAX_OFFSET + (FRAME_HEADER_LEN + MAX_PAYLOAD_LEN + DIRECT_ALIGN) as u64;
    let footer_per_frame = (INDEX_ENTRY_LEN + NAMESPACE_SUMMARY_LEN) as u64;
    data + data / FRAME_HEADER_LEN as u64 * footer_per_frame
        + (FOOTER_FIXED_LEN + 4 + TRAILER_LEN + DIRECT_ALIGN) as u64
};

/// The longest footer a sealed segment whose frames end before `data_end` can have: one entry
/// and at most one namespace summary per frame, each frame at least a frame header long.
pub(crate) fn max_footer_len(data_end: u64) -> u64 {
    let per_frame = (INDEX_ENTRY_LEN + NAMESPACE_SUMMARY_LEN) as u64;
    (data_end / FRAME_HEADER_LEN as u64).saturating_mul(per_frame) + FOOTER_FIXED_LEN as u64 + 4
}

/// Reads all of `file`, [`WHOLE_READ_CHUNK`] bytes at a time, into a buffer that grows as the
/// bytes arrive; returns as many bytes as its size said at the start. A file over `limit` bytes
/// fails with `FileTooLarge` before anything is read or allocated. Memory that cannot be had
/// fails with `OutOfMemory` rather than aborting the process.
pub(crate) fn read_whole(file: &dyn IoFile, limit: u64) -> std::io::Result<Vec<u8>> {
    use std::io::{Error, ErrorKind};
    let size = file.size()?;
    let too_large = || {
        Error::new(
            ErrorKind::FileTooLarge,
            format!(
                "the file is {size} bytes, more than any the store writes ({limit}): damaged \
                 (a sparse or runaway file)"
            ),
        )
    };
    if size > limit {
        return Err(too_large());
    }
    let size = usize::try_from(size).map_err(|_| too_large())?;
    let mut buf: Vec<u8> = Vec::new();
    while buf.len() < size {
        let n = WHOLE_READ_CHUNK.min(size - buf.len());
        if buf.capacity() - buf.len() < n {
            // Doubling keeps the copies linear in the size; the buffer never outgrows the file.
            let want = buf.capacity().saturating_mul(2).clamp(buf.len() + n, size);
            buf.try_reserve_exact(want - buf.len()).map_err(|e| {
                Error::new(
                    ErrorKind::OutOfMemory,
                    format!("cannot hold the file's {size} bytes in memory: {e}"),
                )
            })?;
        }
        let at = buf.len();
        buf.resize(at + n, 0);
        file.read_exact_at(&mut buf[at..], at as u64)?;
    }
    Ok(buf)
}

/// What recovery found and did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    /// Sealed segments opened from their footers.
    pub sealed_segments: usize,
    /// Records (and tombstones) listed by the segments that were opened.
    pub entries: u64,
    /// Records indexed.
    pub indexed: u64,
    /// Records skipped because their namespace was retired below their sequence.
    pub retired_skipped: u64,
    /// Active segments whose torn tail was truncated: (segment id, valid length).
    pub torn_tails: Vec<(u64, u64)>,
    /// Corrupt records skipped in active segments: (segment id, offset, what was wrong).
    pub corrupt_records: Vec<(u64, u64, String)>,
    /// Segments quarantined: (segment id, why).
    pub quarantined: Vec<(u64, String)>,
    /// Segment files the manifest does not list (left in place for fsck).
    pub orphans: Vec<String>,
    /// Whether the manifest ended in a torn tail (truncated, unless the store was opened
    /// read-only).
    pub manifest_truncated: bool,
    /// Bytes read to open the store (manifest, trailers, footers, active segment).
    pub bytes_read: u64,
    /// Stored payload bytes of the records in the opened segments.
    pub payload_bytes: u64,
    /// Records of sealed segments punched out (evicted under `record-lru`): left out of the
    /// index, not damage.
    pub punched: u64,
}

/// An active segment as recovered, ready to be sealed.
pub(crate) struct RecoveredActive {
    pub(crate) header: SegmentHeader,
    pub(crate) file: Arc<SegmentFile>,
    pub(crate) len: u64,
    pub(crate) entries: Vec<IndexEntry>,
}

pub(crate) struct Recovered {
    pub(crate) segments: BTreeMap<u64, Arc<SegmentFile>>,
    /// Segments the manifest lists as active, with what was found (`None`: never created).
    pub(crate) actives: Vec<(SegmentCreated, Option<RecoveredActive>)>,
    pub(crate) max_record_sequence: Option<u64>,
    /// Superseded records found: (key, the segment holding the older record).
    pub(crate) superseded: Vec<(StateKey, u64)>,
    /// Bytes punched out of each sealed segment.
    pub(crate) punched: HashMap<u64, u64>,
    pub(crate) report: RecoveryReport,
}

/// Whether a hole of `holes` (in order, apart) overlaps the frame of `e`: it was punched out
/// (nothing else makes a hole in a sealed segment's frames).
pub(crate) fn is_punched(e: &IndexEntry, holes: &[(u64, u64)]) -> bool {
    let end = e
        .offset
        .saturating_add((FRAME_HEADER_LEN as u64).saturating_add(u64::from(e.stored_len)));
    // The first hole ending after the frame's start.
    let i = holes.partition_point(|&(_, b)| b <= e.offset);
    holes.get(i).is_some_and(|&(a, _)| a < end)
}

/// Takes the frames punched out of `entries`, noting each record's key and sequence in
/// `punched`; returns how many. A punched record was evicted: no older record of its key may be
/// indexed in its place.
fn without_punched(
    entries: &mut Vec<IndexEntry>,
    holes: &[(u64, u64)],
    punched: &mut Vec<(StateKey, u64)>,
) -> u64 {
    let before = entries.len();
    if !holes.is_empty() {
        entries.retain(|e| {
            if !is_punched(e, holes) {
                return true;
            }
            if let FrameBody::Record(meta) = &e.body {
                punched.push((meta.key, e.record_sequence));
            }
            false
        });
    }
    (before - entries.len()) as u64
}

/// The header segment `created` was written with, from the manifest (its creation time aside).
pub(crate) fn header_of(created: &SegmentCreated, directory: &[u8; 16]) -> SegmentHeader {
    SegmentHeader {
        segment_id: created.segment_id,
        sequence: created.segment_sequence,
        created_unix_ms: 0,
        directory_id: *directory,
        alignment: if created.direct {
            orbitkv_segments::Alignment::Direct
        } else {
            orbitkv_segments::Alignment::Packed
        },
        compression: created.compression,
    }
}

/// Opens a sealed segment from its tail; a failure quarantines it.
fn open_sealed(
    file: &SegmentFile,
    digest: &[u8; 32],
    directory: &[u8; 16],
    report: &mut RecoveryReport,
) -> std::result::Result<Vec<IndexEntry>, String> {
    let (header, _, footer, read) = read_sealed(file, Some(digest))?;
    report.bytes_read += read;
    if header.segment_id != file.id || header.directory_id != *directory {
        return Err("header names another segment or data directory".to_owned());
    }
    Ok(footer.entries)
}

/// Scans an active segment, truncating a torn tail.
fn open_active(
    file: &SegmentFile,
    created: &SegmentCreated,
    directory: &[u8; 16],
    read_only: bool,
    report: &mut RecoveryReport,
) -> Result<Option<(SegmentHeader, u64, Vec<IndexEntry>)>> {
    let bytes = match read_whole(file.file.as_ref(), MAX_SEGMENT_FILE_BYTES) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::FileTooLarge => {
            report.quarantined.push((file.id, e.to_string()));
            return Ok(None);
        }
        Err(e) => return Err(io_err(&file.path, "read")(e)),
    };
    report.bytes_read += bytes.len() as u64;
    let len = bytes.len() as u64;
    let header = match SegmentHeader::decode(&bytes) {
        Ok(h)
            if h.sequence == created.segment_sequence
                && h.segment_id == created.segment_id
                && h.directory_id == *directory =>
        {
            h
        }
        Ok(_) => {
            report
                .quarantined
                .push((file.id, "segment header of another instance".to_owned()));
            return Ok(None);
        }
        Err(e) if bytes.len() < 4096 => {
            // Created but its header never became durable: an empty segment.
            tracing::info!(
                segment = file.id,
                "active segment without a header ({e}): empty"
            );
            return Ok(Some((header_of(created, directory), 0, Vec::new())));
        }
        Err(e) => {
            // A damaged header: the manifest says what it held, and only frames of this
            // segment's sequence verify under it. Unless the store is read-only, it is written
            // again before the scan, so the segment seals with a header that decodes.
            let header = header_of(created, directory);
            let mended = if read_only {
                "scanned under the manifest's"
            } else {
                file.file
                    .write_all_at(&header.encode(), 0)
                    .and_then(|()| file.file.sync())
                    .map_err(io_err(&file.path, "rewrite a damaged segment header"))?;
                "written again from the manifest"
            };
            tracing::warn!(
                segment = file.id,
                "active segment's header was damaged ({e}): {mended}"
            );
            report
                .corrupt_records
                .push((file.id, 0, format!("segment header: {e}; {mended}")));
            header
        }
    };
    let mut scanner = Scanner::new(&bytes, header, ScanMode::TolerateTail);
    let mut entries = Vec::new();
    for item in scanner.by_ref() {
        match item {
            ScanItem::Frame(f) => {
                if !matches!(f.header.body, FrameBody::Padding) {
                    entries.push(IndexEntry::from_frame(f.offset, &f.header));
                }
            }
            ScanItem::Corrupt { offset, error, .. } => {
                report
                    .corrupt_records
                    .push((file.id, offset, error.to_string()));
            }
        }
    }
    let end = scanner.end().cloned();
    let valid_len = end.as_ref().map_or(len, |e| e.valid_len);
    if matches!(end.map(|e| e.reason), Some(StopReason::TornTail { .. })) || valid_len < len {
        if !read_only {
            file.file
                .set_len(valid_len)
                .map_err(io_err(&file.path, "truncate torn tail"))?;
            file.file.sync().map_err(io_err(&file.path, "fsync"))?;
        }
        report.torn_tails.push((file.id, valid_len));
    }
    Ok(Some((header, valid_len, entries)))
}

/// Opens every segment the manifest lists and rebuilds `index`, and `recency` (each record at
/// its sequence).
pub(crate) fn recover(
    io: &dyn Io,
    layout: &Layout,
    state: &ManifestState,
    directory: &[u8; 16],
    read_only: bool,
    (index, recency): (&Index, &Recency),
    report: RecoveryReport,
) -> Result<Recovered> {
    let mut report = report;
    let mut segments = BTreeMap::new();
    let mut actives = Vec::new();
    // Segments in creation order, so later record sequences are applied last.
    let mut listed: Vec<(u64, SegmentState)> = state
        .snapshot
        .segments
        .iter()
        .map(|(id, st)| (*id, *st))
        .collect();
    listed.sort_by_key(|(_, st)| {
        let (SegmentState::Active(c) | SegmentState::Sealed(c, _)) = st;
        c.segment_sequence
    });
    let mut all: Vec<(u64, Vec<IndexEntry>)> = Vec::new();
    let mut punched: HashMap<u64, u64> = HashMap::new();
    let mut punched_records: Vec<(StateKey, u64)> = Vec::new();
    for (id, st) in listed {
        let path = layout.segment(id);
        let mode = if read_only {
            OpenMode::Read
        } else {
            OpenMode::ReadWrite
        };
        let file = match io.open(&path, mode) {
            Ok(f) => Arc::new(SegmentFile::new(id, path.clone(), f)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                if let SegmentState::Active(c) = st {
                    // Listed, never created (a crash between the manifest and the file).
                    actives.push((c, None));
                    continue;
                }
                report
                    .quarantined
                    .push((id, "sealed segment file is missing".to_owned()));
                continue;
            }
            // Anything else (EMFILE, EIO) may be transient: refuse to open rather than decide
            // durably that the segment is gone.
            Err(e) => return Err(io_err(&path, "open segment")(e)),
        };
        match st {
            SegmentState::Sealed(_, sealed) => {
                match open_sealed(&file, &sealed.footer_digest, directory, &mut report) {
                    Ok(mut entries) => {
                        report.sealed_segments += 1;
                        // Holes are listed by the file system; where it cannot, none are, and
                        // a punched record reads as a checksum failure: a miss.
                        let holes = file.file.holes().unwrap_or_else(|e| {
                            tracing::warn!(segment = id, "cannot list holes: {e}");
                            Vec::new()
                        });
                        report.punched +=
                            without_punched(&mut entries, &holes, &mut punched_records);
                        let freed: u64 = holes.iter().map(|(a, b)| b - a).sum();
                        if freed > 0 {
                            punched.insert(id, freed);
                        }
                        all.push((id, entries));
                        segments.insert(id, file);
                    }
                    Err(reason) => report.quarantined.push((id, reason)),
                }
            }
            SegmentState::Active(c) => {
                if let Some((header, len, entries)) =
                    open_active(&file, &c, directory, read_only, &mut report)?
                {
                    all.push((id, entries.clone()));
                    segments.insert(id, file.clone());
                    actives.push((
                        c,
                        Some(RecoveredActive {
                            header,
                            file,
                            len,
                            entries,
                        }),
                    ));
                }
            }
        }
    }
    // Tombstones first: a record is indexed only when it is newer than every tombstone of its key.
    // A punched record is one too: were an older record of its key left whole (its own punch
    // lost, or never made), it must not come back in the evicted one's place.
    let mut tombs: HashMap<StateKey, u64> = HashMap::new();
    // A punched record's sequence is on disk still, in its footer: never given out again.
    let mut max_seq = None;
    for &(key, seq) in &punched_records {
        let t = tombs.entry(key).or_default();
        *t = (*t).max(seq);
        max_seq = max_seq.max(Some(seq));
    }
    let punched_tombs: HashMap<StateKey, u64> = tombs.clone();
    for (_, entries) in &all {
        for e in entries {
            max_seq = max_seq.max(Some(e.record_sequence));
            if let FrameBody::Tombstone { key } = &e.body {
                let t = tombs.entry(*key).or_default();
                *t = (*t).max(e.record_sequence);
            }
        }
    }
    let mut superseded = Vec::new();
    for (id, entries) in &all {
        for e in entries {
            report.entries += 1;
            let FrameBody::Record(meta) = &e.body else {
                continue;
            };
            report.payload_bytes += u64::from(e.stored_len);
            let Ok(segment) = u32::try_from(*id) else {
                continue;
            };
            let rec = Record {
                tier: Tier::Ssd,
                segment,
                offset: e.offset,
                stored_len: e.stored_len,
                range: meta.range,
                sequence: e.record_sequence,
                format: meta.format,
            };
            // Every record found takes space until it is punched out or its segment goes, indexed
            // or not; the older ones leave first.
            recency.insert(meta.key, &rec, Some(e.record_sequence));
            if state.is_retired(&meta.key.namespace, e.record_sequence) {
                report.retired_skipped += 1;
                continue;
            }
            if tombs
                .get(&meta.key)
                .is_some_and(|&t| t >= e.record_sequence)
            {
                if punched_tombs
                    .get(&meta.key)
                    .is_some_and(|&t| t >= e.record_sequence)
                {
                    // Whole, and kept out only by a hole: while it lies here, no newer
                    // record of its key may go, nor the segment holding that hole.
                    superseded.push((meta.key, *id));
                }
                continue;
            }
            let Ok(inserted) = index.insert(&meta.key, rec) else {
                continue;
            };
            report.indexed += 1;
            match inserted {
                Insert::Inserted => {}
                Insert::Replaced { previous } => {
                    superseded.push((meta.key, u64::from(previous.segment)));
                }
                Insert::Kept { .. } => superseded.push((meta.key, *id)),
            }
        }
    }
    // Files nobody lists.
    let listed_names: Vec<String> = state
        .snapshot
        .segments
        .keys()
        .filter_map(|id| layout.segment(*id).file_name()?.to_str().map(str::to_owned))
        .collect();
    if let Ok(names) = io.list_dir(&layout.segments()) {
        report.orphans = names
            .into_iter()
            .filter(|n| !listed_names.contains(n) && !crate::spare::is_spare(n))
            .collect();
    }
    Ok(Recovered {
        segments,
        actives,
        max_record_sequence: max_seq,
        superseded,
        punched,
        report,
    })
}
