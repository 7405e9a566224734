//! The spare segment file: a reclaimed segment's file, kept for the next new segment to
//! overwrite instead of a fresh file.
//!
//! A direct write over blocks a file already holds changes no file-system metadata. Over new or
//! preallocated blocks, each fdatasync also commits their allocation (on ext4, a journal
//! commit). Over written blocks, a sync per 4 MiB batch ran 1.1–1.9× faster on this project's
//! disks (docs/performance.md, group commit). Database logs recycle their files for this reason.
//!
//! So the store keeps one reclaimed file, named [`crate::dir::SPARE_SEGMENT`]. The next segment
//! takes it over: its header is written and synced first, then the file takes the segment's
//! name. Frames of the file's earlier life carry an older segment sequence. A scan never takes
//! them for this segment's: recovery truncates them as a torn tail. A read checks the record
//! sequence the index names: a reader still holding the old segment reads a miss. Sealing cuts
//! the file at the trailer, so a trailer is always the file's end.
//!
//! Only direct segments recycle: buffered writes leave block allocation to writeback. The spare
//! counts against the SSD budget, as every file in the segments directory does. It is kept only
//! when the put that reclaimed it starts a new segment, which takes it over at once. So the
//! spare's bytes count as that put's room, and no record is evicted for it. The new segment then
//! counts its appends, as a direct segment sized ahead of them does.

use std::sync::Arc;

use orbitkv_segments::{Alignment, SegmentHeader};

use crate::active::SegmentFile;
use crate::io::{IoFile, OpenMode};
use crate::{Policy, StateStore, Writer};

/// A segment file larger than this many configured segments is removed, not kept.
const MAX_SPARE_SEGMENTS: u64 = 2;

impl StateStore {
    /// Gives up the file of a segment whose deletion the manifest has committed: with `keep`,
    /// kept as the spare when there is none yet and it is no larger than
    /// [`MAX_SPARE_SEGMENTS`] segments; else removed ([`StateStore::remove_segment_file`]).
    /// The spare stays counted in the SSD budget, as any file in the segments directory. The
    /// caller syncs the directory.
    pub(crate) fn retire_segment_file(&self, w: &mut Writer, file: &SegmentFile, keep: bool) {
        if keep && w.spare.is_none() && self.recycles() {
            let size = file.file.size().unwrap_or(u64::MAX);
            let spare = self.layout.spare_segment();
            if self.fits_spare(size) {
                match self.io.rename(&file.path, &spare) {
                    Ok(()) => {
                        w.spare = Some(size);
                        return;
                    }
                    Err(e) => tracing::debug!(
                        path = %file.path.display(),
                        "cannot keep a reclaimed segment file as the spare ({e}); removing it"
                    ),
                }
            }
        }
        self.remove_segment_file(&file.path);
    }

    /// The spare file, renamed to `seg_path` with `header` written and synced, and its size;
    /// `None` when there is no spare or it cannot be taken over (then it is removed: a fresh
    /// file is created instead). The caller syncs the directory.
    pub(crate) fn take_spare(
        &self,
        w: &mut Writer,
        header: &SegmentHeader,
        seg_path: &std::path::Path,
    ) -> Option<(Arc<dyn IoFile>, u64)> {
        w.spare.take()?;
        let spare = self.layout.spare_segment();
        let taken = self.io.open(&spare, OpenMode::ReadWrite).and_then(|f| {
            // The header is durable before the file takes the segment's name, so a file
            // under that name never starts with another segment's header.
            f.write_all_at(&header.encode(), 0)?;
            f.sync()?;
            let size = f.size()?;
            self.io.rename(&spare, seg_path)?;
            Ok((f, size))
        });
        match taken {
            Ok((f, size)) => {
                // Counted from now on as the new segment's appends.
                w.ssd_used = w.ssd_used.saturating_sub(size);
                crate::stats::Stats::add(&self.stats.recycled_segments, 1);
                tracing::debug!(
                    segment = header.segment_id,
                    recycled = true,
                    "a new segment over the spare file"
                );
                Some((f, size))
            }
            Err(e) => {
                tracing::debug!(
                    path = %spare.display(),
                    "cannot reuse the spare segment file ({e}); creating a new one"
                );
                self.remove_segment_file(&spare);
                self.recount_used(w);
                None
            }
        }
    }

    /// Whether reclaimed files are kept for reuse: with an SSD budget (else nothing is
    /// reclaimed), on direct segments (buffered writes leave block allocation to writeback),
    /// but not under [`Policy::RecordLru`] (a segment goes once its records are punched out: its
    /// file has no blocks left to reuse).
    pub(crate) fn recycles(&self) -> bool {
        self.config.ssd_bytes.is_some()
            && self.config.alignment == Alignment::Direct
            && self.config.policy != Policy::RecordLru
    }

    /// Whether a file of `size` bytes may be the spare.
    pub(crate) fn fits_spare(&self, size: u64) -> bool {
        size <= MAX_SPARE_SEGMENTS.saturating_mul(self.config.segment_bytes)
    }

    /// The spare file's size when one is kept in the segments directory (on open).
    pub(crate) fn find_spare(&self) -> Option<u64> {
        let spare = self.layout.spare_segment();
        self.io
            .open(&spare, OpenMode::Read)
            .and_then(|f| f.size())
            .ok()
    }
}

/// Whether `name`, in the segments directory, is the spare file.
pub(crate) fn is_spare(name: &str) -> bool {
    name == crate::dir::SPARE_SEGMENT
}
