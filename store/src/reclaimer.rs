//! The SSD tier's capacity: when the segments would outgrow [`crate::StoreConfig::ssd_bytes`],
//! whole sealed segments are reclaimed (log-structured: no record is ever rewritten in place).
//!
//! The default policy, [`Policy::FifoReinsert`], keeps one log. Its oldest sealed segment is
//! reclaimed: a record read since it was last written is copied forward to the head of the
//! log, the rest are dropped. [`Policy::S3Fifo`] keeps two logs: new bundles go to the probation
//! log, whose segments are reclaimed first once it holds more than a tenth of the budget; a
//! record read while there is copied into the main log when its segment is reclaimed, one
//! reclaimed unread is dropped and remembered by a ghost set, and a bundle whose key the ghost
//! remembers is written straight to the main log. A copy takes a new record sequence (only a
//! key's current record is copied, under the writer lock, so it overtakes nothing newer), is
//! durable before the reclaimed segment's deletion is committed to the manifest, and the index
//! moves to it only then, so a crash at any point loses no record that was not being evicted and
//! serves none that was superseded or retired (a crash before the deletion leaves both copies:
//! the same bytes, the newer sequence kept). Segments holding pinned records are never reclaimed.
//!
//! The default is the policy whose worst cell is best in the policy matrix (every generated
//! workload shape and the shared trace, 5–50 % of their distinct blocks, against per-block LRU):
//! S3-FIFO wins on the shared trace but loses up to 26 % on multi-turn conversations
//! (docs/performance.md has the numbers and the command).

use std::collections::HashSet;
use std::path::Path;
use std::sync::{Mutex, MutexGuard};

use orbitkv_segments::footer::{FOOTER_FIXED_LEN, INDEX_ENTRY_LEN, NAMESPACE_SUMMARY_LEN};
use orbitkv_segments::segment_header::DIRECT_ALIGN;
use orbitkv_segments::{FrameBody, IndexEntry, TRAILER_LEN};
use orbitkv_state::StateKey;
use orbitkv_wal::{ManifestRecord, SegmentState};

use crate::active::{SegmentFile, read_entry_payload, read_sealed};
use crate::error::{Error, Result};
use crate::forward::{Copied, Target};
use crate::ghost::fingerprint;
use crate::io::OpenMode;
use crate::recency::punch_range;
use crate::stats::Stats;
use crate::{StateStore, Writer};

/// What the SSD tier evicts when it is full.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Policy {
    /// Records, least recently used first (a chain's deepest first among records used
    /// together), each punched out of its sealed segment; a segment left empty is deleted.
    #[default]
    RecordLru,
    /// Two logs, probation and main, with a ghost set; records read are copied forward.
    S3Fifo,
    /// One log: the oldest segment is dropped whole.
    Fifo,
    /// One log: the oldest segment is reclaimed, its records read since written copied forward.
    FifoReinsert,
}

impl Policy {
    /// Every policy, by name.
    pub const ALL: [(&'static str, Policy); 4] = [
        ("record-lru", Policy::RecordLru),
        ("s3-fifo", Policy::S3Fifo),
        ("fifo", Policy::Fifo),
        ("fifo-reinsert", Policy::FifoReinsert),
    ];

    /// The policy's name.
    pub fn name(self) -> &'static str {
        match self {
            Policy::RecordLru => "record-lru",
            Policy::S3Fifo => "s3-fifo",
            Policy::Fifo => "fifo",
            Policy::FifoReinsert => "fifo-reinsert",
        }
    }

    fn reinserts(self) -> bool {
        self != Policy::Fifo
    }
}

/// Which log a segment belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Log {
    /// New bundles (S3-FIFO only).
    Probation = 0,
    /// Everything else.
    Main = 1,
}

/// The record locations read since they were written, exactly: a record is marked when it is
/// read and its mark taken when its segment is reclaimed or compacted (for every record in it,
/// live or dead, so no mark outlives its segment; locations are never reused, as segment ids are
/// not). Sharded so readers rarely meet; nothing is marked without an SSD budget, where nothing
/// is reclaimed. A hashed bit table was tried first: on the shared trace even 1–2% colliding
/// bits cost the copy-forward policies 2–5 points of hit ratio, because losing the mark of a
/// hot prefix block drops the start of every chain through it.
pub(crate) struct ReadMarks {
    shards: Box<[Mutex<Locations>]>,
    enabled: bool,
}

const MARK_SHARDS: u64 = 64;

/// (segment, offset) pairs.
type Locations = HashSet<(u64, u64)>;

impl ReadMarks {
    /// Marks for a tier with (`enabled`) or without an SSD budget.
    pub(crate) fn new(enabled: bool) -> Self {
        Self {
            shards: (0..MARK_SHARDS).map(|_| Mutex::default()).collect(),
            enabled,
        }
    }

    fn shard(&self, segment: u64, offset: u64) -> MutexGuard<'_, Locations> {
        let h = (segment.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (offset >> 9))
            .wrapping_mul(0xBF58_476D_1CE4_E5B9);
        let i = (h >> 58) % MARK_SHARDS;
        self.shards[i as usize]
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// Marks the record at (`segment`, `offset`) read.
    pub(crate) fn mark(&self, segment: u64, offset: u64) {
        if self.enabled {
            self.shard(segment, offset).insert((segment, offset));
        }
    }

    /// Whether the record at (`segment`, `offset`) was read, taking the mark.
    pub(crate) fn take(&self, segment: u64, offset: u64) -> bool {
        self.enabled && self.shard(segment, offset).remove(&(segment, offset))
    }
}

impl StateStore {
    /// File bytes of every file in the segments directory: the open segments, active ones
    /// included, and every other file there (a file whose deletion failed, an orphan, a
    /// quarantined segment), since each still takes disk space. A size that cannot be read
    /// counts as what is known of the file ([`StateStore::known_size`]), never as 0. When the
    /// directory cannot be listed, the count does not drop below the previous one.
    pub(crate) fn recount_used(&self, w: &mut Writer) {
        let segs = self.segments.read().unwrap_or_else(|p| p.into_inner());
        let mut used: u64 = segs
            .values()
            .map(|s| {
                let punched = w.punched.get(&s.id).copied().unwrap_or(0);
                self.size_or_known(w, s).saturating_sub(punched)
            })
            .sum();
        let dir = self.layout.segments();
        match self.io.list_dir(&dir) {
            Ok(names) => {
                let open: HashSet<&Path> = segs.values().map(|s| s.path.as_path()).collect();
                for name in names {
                    let path = dir.join(&name);
                    if !open.contains(path.as_path()) {
                        used += self.unopened_size(w, &path, &name);
                    }
                }
            }
            Err(e) => {
                Stats::add(&self.stats.failed_stats, 1);
                tracing::error!(
                    path = %dir.display(),
                    "cannot list the segments directory ({e}); the SSD budget keeps its previous count"
                );
                used = used.max(w.ssd_used);
            }
        }
        w.ssd_used = used;
    }

    /// The size of open segment `seg`'s file; when it cannot be read, what is known of it
    /// (counted and logged).
    pub(crate) fn size_or_known(&self, w: &Writer, seg: &SegmentFile) -> u64 {
        // A segment whose file is sized ahead of its appends counts its appends, as it would
        // unsized: the rest is reserved space, like a preallocation past the end.
        if let Some(a) = w
            .active
            .iter()
            .flatten()
            .find(|a| a.seg.id == seg.id && a.sized_ahead())
        {
            return a.len;
        }
        match seg.file.size() {
            Ok(n) => n,
            Err(e) => {
                Stats::add(&self.stats.failed_stats, 1);
                let known = self.known_size(w, seg.id);
                tracing::warn!(
                    path = %seg.path.display(),
                    counted = known,
                    "cannot read a segment file's size ({e}); counting what is known of it"
                );
                known
            }
        }
    }

    /// The size of a file in the segments directory that no open segment holds. A file gone
    /// meanwhile takes nothing; a size that cannot be read counts as what is known of it.
    fn unopened_size(&self, w: &Writer, path: &Path, name: &str) -> u64 {
        match self.io.open(path, OpenMode::Read).and_then(|f| f.size()) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0,
            Err(e) => {
                Stats::add(&self.stats.failed_stats, 1);
                let known = name
                    .strip_suffix(".seg")
                    .and_then(|hex| u64::from_str_radix(hex, 16).ok())
                    .map_or(self.config.segment_bytes, |id| self.known_size(w, id));
                tracing::warn!(
                    path = %path.display(),
                    counted = known,
                    "cannot read the size of a file in the segments directory ({e}); counting \
                     what is known of it"
                );
                known
            }
        }
    }

    /// The most a segment file can hold as far as the store knows without asking the file: an
    /// active segment's appended length; a sealed one's data end plus the largest footer and
    /// trailer its record count allows; else a whole configured segment.
    fn known_size(&self, w: &Writer, id: u64) -> u64 {
        if let Some(a) = w.active.iter().flatten().find(|a| a.seg.id == id) {
            return a.len;
        }
        match w.manifest.state.snapshot.segments.get(&id) {
            Some(SegmentState::Sealed(_, sealed)) => {
                let per_record = (INDEX_ENTRY_LEN + NAMESPACE_SUMMARY_LEN) as u64;
                let fixed = (FOOTER_FIXED_LEN + 4 + TRAILER_LEN + DIRECT_ALIGN) as u64;
                sealed
                    .data_end
                    .saturating_add(sealed.records.saturating_mul(per_record))
                    .saturating_add(fixed)
            }
            _ => self.config.segment_bytes,
        }
    }

    /// Removes a segment file whose deletion the manifest has committed. A failure is counted
    /// and logged: the file stays counted in the SSD budget ([`StateStore::recount_used`]) and
    /// `fsck --repair` removes it as an orphan.
    pub(crate) fn remove_segment_file(&self, path: &Path) {
        match self.io.remove_file(path) {
            Ok(()) => {}
            // Never created, or already gone: it takes no space.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                Stats::add(&self.stats.failed_deletes, 1);
                tracing::error!(
                    path = %path.display(),
                    "cannot delete a segment file the manifest no longer lists ({e}); it stays \
                     counted in the SSD budget until `orbitkv fsck --repair` removes it"
                );
            }
        }
    }

    /// Makes the segments directory's removals durable. A failure is counted and logged: a
    /// removed file may come back after a power loss, as an orphan that the SSD budget counts
    /// and `fsck --repair` removes.
    pub(crate) fn sync_segments_dir(&self) {
        let dir = self.layout.segments();
        if let Err(e) = self.io.sync_dir(&dir) {
            Stats::add(&self.stats.failed_dir_syncs, 1);
            tracing::warn!(
                path = %dir.display(),
                "cannot fsync the segments directory after deleting files ({e}); a deleted \
                 file may come back after a power loss, as an orphan"
            );
        }
    }

    /// Reclaims segments until `need` more bytes fit the SSD budget. Fails with
    /// [`Error::CapacityExhausted`] when every reclaimable segment is pinned or active.
    ///
    /// `next` names the append the room is for (its log and frame bytes). When that append
    /// starts a new segment, a reclaimed file is kept as the spare (crate::spare) and the new
    /// segment takes it over within the same put: the spare's bytes count as room.
    pub(crate) fn make_room(
        &self,
        w: &mut Writer,
        need: u64,
        next: Option<(Log, u64)>,
    ) -> Result<()> {
        let Some(budget) = self.config.ssd_bytes else {
            return Ok(());
        };
        if self.config.policy == Policy::RecordLru {
            self.evict_records(w, need, budget)?;
        }
        // Every round drops a segment; copies forward take their read marks, so records read
        // once are not copied twice. Records kept for another reason (an older record of the
        // key in a pinned segment) can make rounds free little or nothing, so one call reclaims
        // at most about every segment twice, and stops after more fruitless rounds in a row
        // than there are segments; then the put is refused.
        let segments = self
            .segments
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .len();
        let max_rounds = 2 * segments + 8;
        let mut rounds = 0usize;
        let mut fruitless = 0usize;
        // The spare's bytes, when the next append's new segment takes it over.
        let credit = |w: &Writer| match (w.spare, next) {
            (Some(spare), Some((log, n))) if self.starts_segment(w, log, n) => spare,
            _ => 0,
        };
        while w.ssd_used + need > budget.saturating_add(credit(w)) {
            rounds += 1;
            let victim = (rounds <= max_rounds && fruitless <= segments + 1)
                .then(|| self.pick_victim(w, budget))
                .flatten();
            let Some(victim) = victim else {
                Stats::add(&self.stats.capacity_refusals, 1);
                return Err(Error::CapacityExhausted {
                    need,
                    used: w.ssd_used,
                    budget,
                });
            };
            let before = w.ssd_used;
            self.reclaim(w, victim, next)?;
            self.recount_used(w);
            if w.ssd_used >= before {
                fruitless += 1;
            } else {
                fruitless = 0;
            }
        }
        Ok(())
    }

    /// [`Policy::RecordLru`]: evicts records, least recently used first, until `need` more bytes
    /// fit `budget` or no record can go. Each is dropped from the index and punched out of its
    /// sealed segment; a segment left holding none is reclaimed whole. A record stays (put back
    /// as it was) while its segment is active or pinned, or while an older record of its key
    /// lies in another segment (a restart would serve that one: see superseded.rs). One pinned
    /// in the moment of its eviction leaves the index but keeps its bytes. What is still short
    /// is left to whole-segment reclaim.
    fn evict_records(&self, w: &mut Writer, need: u64, budget: u64) -> Result<()> {
        let mut stay = Vec::new();
        let mut result = Ok(());
        while w.ssd_used + need > budget {
            let Some(v) = self.recency.pop_oldest() else {
                break;
            };
            let (seg, offset) = v.at;
            let direct = match w.manifest.state.snapshot.segments.get(&seg) {
                Some(SegmentState::Sealed(created, _)) => created.direct,
                // Recovery scans an active segment, and a hole would end its scan.
                Some(SegmentState::Active(_)) => {
                    stay.push(v);
                    continue;
                }
                // Gone with its segment.
                None => continue,
            };
            let e = &v.entry;
            let live = self.is_live(&e.key, seg, offset, e.sequence);
            if live && self.superseded.elsewhere(&e.key, seg) {
                stay.push(v);
                continue;
            }
            // A pinned segment's records stay indexed until the pin goes.
            if self.pins.holds_segment(seg) {
                stay.push(v);
                continue;
            }
            let evicted = live && self.index.remove(&e.key, Some(e.sequence)).is_some();
            if evicted {
                self.dram.remove(&e.key, e.sequence);
                Stats::add(&self.stats.evicted_records, 1);
            }
            // Checked after the index let go of it: a pin taken before is seen here, and none
            // can be taken after. A pinned reader keeps the bytes until its pin goes.
            let pinned = self.pins.holds_segment(seg);
            if pinned || !self.punch(w, seg, offset, e.frame_len, direct) {
                // Whole on disk and out of the index: a newer record of its key must not go
                // while this one could come back after a restart. (A punched one's hole stands
                // for it on open: no older record of its key is indexed.)
                self.superseded.note(&e.key, seg);
            }
            if pinned {
                stay.push(v);
                continue;
            }
            if self.recency.held_in(seg) == 0
                && !self.is_quarantined(seg)
                && !self.pins.holds_segment(seg)
            {
                if let Err(e) = self.reclaim(w, seg, None) {
                    result = Err(e);
                    break;
                }
                self.recount_used(w);
            }
        }
        for v in stay {
            self.recency.restore(v);
        }
        result
    }

    /// Punches the frame at `offset` (`frame_len` bytes) out of sealed segment `seg`, giving
    /// its whole pages back to the file system. A failure is counted and logged; the bytes stay
    /// counted until the segment goes. After `Unsupported` no punch is tried again, nor after a
    /// first punch the file's list of holes does not show: recovery could not tell a punched
    /// record from a damaged one.
    fn punch(&self, w: &mut Writer, seg: u64, offset: u64, frame_len: u64, direct: bool) -> bool {
        let Some((at, len)) = punch_range(offset, frame_len, direct) else {
            return false;
        };
        if w.punch_unsupported {
            return false;
        }
        let Some(file) = self.segment_file(seg) else {
            return false;
        };
        match file.file.punch_hole(at, len) {
            Ok(()) => {
                w.unsynced_punches.insert(seg);
                *w.punched.entry(seg).or_default() += len;
                w.ssd_used = w.ssd_used.saturating_sub(len);
                Stats::add(&self.stats.punched_records, 1);
                Stats::add(&self.stats.punched_bytes, len);
                if !w.punch_checked {
                    w.punch_checked = true;
                    let listed = file
                        .file
                        .holes()
                        .is_ok_and(|holes| holes.iter().any(|&(a, b)| a < at + len && b > at));
                    if !listed {
                        w.punch_unsupported = true;
                        tracing::warn!(
                            path = %file.path.display(),
                            "the file system does not list the holes punches make: evicted \
                             records keep their space until their whole segment goes"
                        );
                    }
                }
                true
            }
            Err(e) => {
                Stats::add(&self.stats.failed_punches, 1);
                if e.kind() == std::io::ErrorKind::Unsupported {
                    w.punch_unsupported = true;
                    tracing::warn!(
                        path = %file.path.display(),
                        "the file system cannot punch holes ({e}): evicted records keep their \
                         space until their whole segment goes"
                    );
                } else {
                    tracing::warn!(
                        path = %file.path.display(),
                        offset = at,
                        "cannot punch an evicted record out ({e}); its space stays counted \
                         until its segment goes"
                    );
                }
                false
            }
        }
    }

    /// Makes the punches since the last call durable (an fsync of each file punched), before a
    /// segment's deletion is committed. A deleted segment takes its holes, the tombstones of its
    /// punched records, with it: an older record of one of their keys whose own punch was lost
    /// could come back. A file whose fsync fails stays to be synced again, and its holes are
    /// not relied on (the caller gives up the deletion).
    pub(crate) fn sync_punches(&self, w: &mut Writer) -> Result<()> {
        let segs: Vec<u64> = w.unsynced_punches.iter().copied().collect();
        for seg in segs {
            if let Some(file) = self.segment_file(seg) {
                file.file.sync().map_err(|source| Error::Io {
                    path: file.path.clone(),
                    op: "sync",
                    source,
                })?;
            }
            w.unsynced_punches.remove(&seg);
        }
        Ok(())
    }

    /// Under [`Policy::RecordLru`], whether sealed segment `id` (its footer `entries`) must stay:
    /// one of its records is out of the index while an older record of its key lies whole in
    /// another segment. Its hole (or its bytes) stands for that eviction on open.
    pub(crate) fn stands_for_evictions(&self, id: u64, entries: &[IndexEntry]) -> bool {
        self.config.policy == Policy::RecordLru
            && entries.iter().any(|e| match &e.body {
                FrameBody::Record(meta) => {
                    !self.is_live(&meta.key, id, e.offset, e.record_sequence)
                        && self.superseded.elsewhere(&meta.key, id)
                }
                _ => false,
            })
    }

    /// The segment to reclaim: sealed, not pinned, oldest first — from the probation log while
    /// it holds more than a tenth of the budget (S3-FIFO), else from the main log.
    fn pick_victim(&self, w: &Writer, budget: u64) -> Option<u64> {
        let pinned = self.pins.pinned_segments();
        let segs = self.segments.read().unwrap_or_else(|p| p.into_inner());
        let candidates: Vec<u64> = w
            .manifest
            .state
            .snapshot
            .segments
            .iter()
            .filter(|(id, st)| {
                matches!(st, SegmentState::Sealed(..))
                    && !pinned.contains(id)
                    && segs.contains_key(id)
            })
            .map(|(id, _)| *id)
            .collect();
        if self.config.policy != Policy::S3Fifo {
            return candidates.first().copied();
        }
        let probation_bytes: u64 = w
            .probation
            .iter()
            .filter_map(|id| segs.get(id))
            .map(|s| self.size_or_known(w, s))
            .sum();
        let oldest_probation = candidates.iter().find(|id| w.probation.contains(id));
        let oldest_main = candidates.iter().find(|id| !w.probation.contains(id));
        let from_probation = probation_bytes > budget / 10 || oldest_main.is_none();
        if from_probation {
            oldest_probation.or(oldest_main).copied()
        } else {
            oldest_main.or(oldest_probation).copied()
        }
    }

    /// Reclaims sealed segment `id`: copies the records the policy keeps into the main log
    /// (synced), moves the index to them, drops the rest, commits the deletion, removes the file
    /// — or keeps it as the spare, when the append `next` starts a new segment (after the
    /// copies, which may have started one already).
    fn reclaim(&self, w: &mut Writer, id: u64, next: Option<(Log, u64)>) -> Result<()> {
        let Some(file) = self.segment_file(id) else {
            return Ok(());
        };
        tracing::debug!(phase = "reclaim", step = "begin", segment = id);
        // Copies forward take new sequences: none may overtake a newer record waiting for its
        // sync.
        self.publish_held_back(w);
        let from_probation = w.probation.contains(&id);
        let digest = crate::compactor::seal_digest(&w.manifest.state, id);
        let entries = match read_sealed(&file, digest.as_ref()) {
            Ok((_, _, footer, _)) => footer.entries,
            Err(why) => {
                // Its records cannot be listed; they are misses once the file is gone.
                tracing::warn!(
                    segment = id,
                    "reclaiming a segment whose footer fails: {why}"
                );
                Vec::new()
            }
        };
        if self.stands_for_evictions(id, &entries) {
            return Ok(());
        }
        // Before anything moves: the punches its deletion will rely on.
        self.sync_punches(w)?;
        let mut kept: Vec<Copied> = Vec::new();
        let mut dropped: Vec<(StateKey, u64)> = Vec::new();
        for e in &entries {
            let FrameBody::Record(meta) = &e.body else {
                continue;
            };
            // Taken for every record, live or not, so no stale mark outlives its segment.
            let read = self.read_marks.take(id, e.offset);
            if !self.is_live(&meta.key, id, e.offset, e.record_sequence) {
                continue;
            }
            // A record whose key has an older record in another segment is kept, or a restart
            // would serve that superseded record (see superseded.rs).
            let keep = match self.config.policy {
                // A record still live here was never evicted (a pin, or no punch).
                Policy::RecordLru => true,
                p => p.reinserts() && read,
            } || self.superseded.elsewhere(&meta.key, id);
            let payload = if keep {
                read_entry_payload(&file, e)
                    .inspect_err(|why| {
                        tracing::warn!(
                            segment = id,
                            offset = e.offset,
                            "a record to keep is dropped with its segment: {why}"
                        );
                    })
                    .ok()
            } else {
                None
            };
            let Some(payload) = payload else {
                dropped.push((meta.key, e.record_sequence));
                continue;
            };
            // A new sequence keeps the segment's sequences increasing; the record is its key's
            // current one (checked above, under the writer lock), so nothing newer is overtaken.
            let copied =
                self.copy_forward(w, Target::MainLog, meta, &payload, e.record_sequence, false)?;
            kept.extend(copied);
        }
        // The copies are durable before the original's deletion is, and so are the records
        // that superseded the ones dropped (a power loss must not take a synced record and its
        // unsynced successor both).
        self.sync_log(w, Log::Probation)?;
        self.sync_log(w, Log::Main)?;
        for c in &kept {
            // Its DRAM copy names the old sequence: dropped; the next read brings it back.
            self.adopt_copy(c)?;
        }
        for e in &entries {
            self.recency.forget((id, e.offset));
        }
        let capacity = self.index.len().max(1024);
        for (key, seq) in &dropped {
            if self.index.remove(key, Some(*seq)).is_some() {
                self.dram.remove(key, *seq);
                if from_probation {
                    w.ghost.remember(fingerprint(key), capacity);
                }
            }
        }
        w.append_manifest(ManifestRecord::SegmentDeleted { segment_id: id })?;
        self.segments
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&id);
        w.probation.remove(&id);
        w.punched.remove(&id);
        self.superseded.segment_gone(id);
        let keep = next.is_some_and(|(log, n)| self.starts_segment(w, log, n));
        self.retire_segment_file(w, &file, keep);
        // Durable now, or the file could come back after a power loss, an orphan.
        self.sync_segments_dir();
        Stats::add(&self.stats.reclaimed_segments, 1);
        Stats::add(&self.stats.evicted_records, dropped.len() as u64);
        Stats::add(&self.stats.reinserted_records, kept.len() as u64);
        tracing::debug!(phase = "reclaim", step = "end", segment = id);
        tracing::debug!(
            segment = id,
            kept = kept.len(),
            dropped = dropped.len(),
            "reclaimed a segment"
        );
        Ok(())
    }
}
