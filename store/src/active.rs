//! Segment files: the active segment the writer appends frames to, and the sealed segments
//! readers read records from.
//!
//! It is over 600 lines: the write-behind tail, the writes in flight and the reads that serve
//! them share one buffer list, kept in one file.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};

use orbitkv_index::Record;
use orbitkv_segments::footer::{Footer, footer_digest};
use orbitkv_segments::frame::encode_frame_after;
use orbitkv_segments::{
    Alignment, Compression, FRAME_HEADER_LEN, FrameBody, FrameHeader, IndexEntry, RecordMeta,
    SEGMENT_HEADER_LEN, SegmentHeader, TRAILER_LEN, Trailer,
};
use orbitkv_state::StateKey;

use crate::error::{Result, io_err};
use crate::framed::FrameBuf;
use crate::io::aligned::write_vec;
use crate::io::{IoFile, WriteBuf};

/// An open segment file, shared by readers.
pub(crate) struct SegmentFile {
    pub(crate) id: u64,
    pub(crate) path: PathBuf,
    pub(crate) file: Arc<dyn IoFile>,
    /// The active segment's write-behind tail: frames appended (and indexed) but not yet
    /// written to the file. Readers look here first for offsets at or past its start.
    pub(crate) pending: RwLock<Pending>,
}

impl SegmentFile {
    pub(crate) fn new(id: u64, path: PathBuf, file: Arc<dyn IoFile>) -> Self {
        Self {
            id,
            path,
            file,
            pending: RwLock::default(),
        }
    }

    /// Calls `f` with the bytes of `len` at `offset` if they are still in the write-behind tail.
    pub(crate) fn with_pending<R>(
        &self,
        offset: u64,
        len: usize,
        f: impl FnOnce(&[u8]) -> R,
    ) -> Option<R> {
        let p = self.pending.read().unwrap_or_else(|e| e.into_inner());
        offset.checked_add(len as u64)?;
        if let Some(at) = offset.checked_sub(p.start) {
            let at = p.pad + usize::try_from(at).ok()?;
            if let Some(b) = p.bytes.get(at..at.checked_add(len)?) {
                return Some(f(b));
            }
        }
        p.in_flight
            .iter()
            .find_map(|(start, buf)| {
                let at = usize::try_from(offset.checked_sub(*start)?).ok()?;
                buf.slice(at, len)
            })
            .map(f)
    }
}

/// Frames appended but not known to be in the file: the tail waiting to be written together
/// (see [`Active::append_encoded`]) and the writes in flight.
#[derive(Default)]
pub(crate) struct Pending {
    /// File offset of the first byte of the tail.
    start: u64,
    /// `pad` bytes of alignment, then the tail's frames.
    bytes: Vec<u8>,
    pad: usize,
    /// Writes submitted and not yet known complete: each one's file offset and bytes.
    in_flight: Vec<(u64, Arc<WriteBuf>)>,
}

impl Pending {
    fn len(&self) -> usize {
        self.bytes.len().saturating_sub(self.pad)
    }
}

/// Bundles smaller than this are gathered in the write-behind tail (with manual durability)
/// and written together once it holds [`WRITE_BEHIND`] bytes, or at a sync: one 2 MiB direct
/// write is about a third faster on this disk than eight of 256 KiB.
pub(crate) const COALESCE_BELOW: usize = 1 << 20;
/// The write-behind tail is written once it holds this much.
pub(crate) const WRITE_BEHIND: usize = 2 << 20;
/// Writes an active segment keeps in flight (with manual durability): the putting thread
/// encodes its next bundle while the device takes the previous ones.
pub(crate) const WRITES_IN_FLIGHT: usize = 4;

/// How far past the appends a direct segment's file size is set at a time
/// ([`Active::size_ahead`]).
pub(crate) const SIZE_AHEAD: u64 = 64 << 20;

/// Buffers of completed writes, kept for the next encode or write-behind tail (so a put neither
/// allocates nor faults in fresh pages).
static SPARE_BUFFERS: Mutex<Vec<(Vec<u8>, usize)>> = Mutex::new(Vec::new());
/// Spare buffers kept at most: enough for one thread to encode a round of bundles while
/// another's are in flight…
const MAX_SPARE_BUFFERS: usize = 4 * WRITES_IN_FLIGHT;
/// …and at most this many bytes of them.
const MAX_SPARE_BYTES: usize = 64 << 20;

/// Whether `buf`'s bytes after `pad` start where `alignment` needs them.
fn aligned_for(buf: &[u8], pad: usize, alignment: Alignment) -> bool {
    alignment != Alignment::Direct
        || (buf.as_ptr() as usize + pad).is_multiple_of(crate::io::aligned::DIRECT_ALIGN)
}

/// A spare buffer with room for `capacity` bytes after its pad, emptied to its pad.
fn take_spare(capacity: usize, alignment: Alignment) -> Option<(Vec<u8>, usize)> {
    let mut spares = SPARE_BUFFERS.lock().unwrap_or_else(|e| e.into_inner());
    let i = spares
        .iter()
        .position(|(b, pad)| b.capacity() >= pad + capacity && aligned_for(b, *pad, alignment))?;
    let (mut b, pad) = spares.swap_remove(i);
    b.truncate(pad);
    Some((b, pad))
}

/// A buffer to write from, for `capacity` bytes after its pad: a spare, or a new one (for
/// direct segments on huge pages, [`write_vec`]).
fn write_buffer(capacity: usize, alignment: Alignment) -> (Vec<u8>, usize) {
    take_spare(capacity, alignment).unwrap_or_else(|| match alignment {
        Alignment::Direct => write_vec(capacity),
        Alignment::Packed => (Vec::with_capacity(capacity), 0),
    })
}

/// Copies `parts`, `len` bytes in all, one after another into one direct write buffer.
fn gather_parts<'a>(parts: impl Iterator<Item = &'a [u8]>, len: usize) -> (Vec<u8>, usize) {
    let (mut bytes, pad) = write_buffer(len, Alignment::Direct);
    for part in parts {
        bytes.extend_from_slice(part);
    }
    (bytes, pad)
}

/// Frames copied one after another into one direct write buffer (a spare, or a new one advised
/// for huge pages; see [`crate::StateStore::gather`]), headers not yet stamped.
pub(crate) struct Gathered {
    bytes: Vec<u8>,
    pad: usize,
    /// Each frame's address, length and payload CRC, in order.
    frames: Vec<FrameId>,
}

/// What tells a frame gathered from the one appended: where its memory is, its length and its
/// payload CRC. The address alone could be reused by another frame, and length and CRC alone
/// could match another payload.
type FrameId = (usize, usize, u32);

fn frame_id(f: &FrameBuf) -> FrameId {
    (f.frame().as_ptr() as usize, f.frame().len(), f.crc())
}

impl Gathered {
    /// Copies `frames` (finished), `len` bytes in all.
    pub(crate) fn new(frames: &[&FrameBuf], len: usize) -> Self {
        let (bytes, pad) = gather_parts(frames.iter().map(|f| f.frame()), len);
        Self {
            bytes,
            pad,
            frames: frames.iter().map(|f| frame_id(f)).collect(),
        }
    }

    /// Copies the parts of `buf` (frames stamped already) into one buffer.
    fn of(buf: &WriteBuf) -> WriteBuf {
        let (bytes, pad) = gather_parts(buf.parts(), buf.len());
        WriteBuf::new(bytes, pad)
    }

    /// Whether it holds exactly these frames, in order (see [`FrameId`]).
    fn holds(&self, frames: &[Arc<FrameBuf>]) -> bool {
        self.frames.len() == frames.len()
            && self
                .frames
                .iter()
                .zip(frames)
                .all(|(held, f)| *held == frame_id(f))
    }

    /// Copies each frame's header, stamped since, over its place; returns the write buffer.
    fn stamped(mut self, frames: &[Arc<FrameBuf>]) -> WriteBuf {
        let mut at = self.pad;
        for f in frames {
            let frame = f.frame();
            self.bytes[at..at + FRAME_HEADER_LEN].copy_from_slice(&frame[..FRAME_HEADER_LEN]);
            at += frame.len();
        }
        WriteBuf::new(self.bytes, self.pad)
    }
}

/// Keeps the buffer of a completed write, when nothing else holds it.
fn give_spare(buf: Arc<WriteBuf>) {
    let Ok(buf) = Arc::try_unwrap(buf) else {
        return;
    };
    if buf.is_frames() {
        // Frames the DRAM tier keeps stay there.
        for f in buf.into_frames() {
            if let Ok(f) = Arc::try_unwrap(f) {
                crate::framed::keep_spare_frame(f);
            }
        }
    } else {
        let (b, pad) = buf.into_parts();
        keep_spare(b, pad);
    }
}

/// Keeps `b` (its bytes start after `pad`) for the next encode, within the spares' bounds.
fn keep_spare(b: Vec<u8>, pad: usize) {
    let mut spares = SPARE_BUFFERS.lock().unwrap_or_else(|e| e.into_inner());
    let held: usize = spares.iter().map(|(b, _)| b.capacity()).sum();
    if b.capacity() > 0
        && b.capacity() <= MAX_SCRATCH
        && spares.len() < MAX_SPARE_BUFFERS
        && held + b.capacity() <= MAX_SPARE_BYTES
    {
        spares.push((b, pad));
    }
}

/// The segment being written.
pub(crate) struct Active {
    pub(crate) header: SegmentHeader,
    pub(crate) seg: Arc<SegmentFile>,
    /// Bytes written (frames end here).
    pub(crate) len: u64,
    /// Bytes known durable.
    pub(crate) synced_len: u64,
    /// Entries of every frame written, for the footer.
    pub(crate) entries: Vec<IndexEntry>,
    /// Index of the first entry not yet durable.
    pub(crate) unsynced_from: usize,
    /// Indexed records not yet durable, with the record each replaced in the index (restored if
    /// they are lost).
    pub(crate) unsynced: Vec<(StateKey, u64, Option<Record>)>,
    /// Records written but not indexed until durable ([`crate::Durability::Group`]).
    pub(crate) staged: Vec<(StateKey, Record)>,
    compression: Compression,
    /// The encode buffer kept between appends, with its alignment pad.
    scratch: (Vec<u8>, usize),
    /// Blocks were reserved past the end ([`IoFile::preallocate`]); sealing releases them.
    pub(crate) preallocated: bool,
    /// Bytes reserved from the file's start at creation (0: unknown, as after a restart).
    pub(crate) reserved: u64,
    /// The file size set ahead of the appends ([`Active::size_ahead`]); 0 before any.
    sized_len: u64,
}

/// Encode buffers larger than this are not kept between appends.
const MAX_SCRATCH: usize = 16 << 20;

impl Active {
    /// A new active segment over `file`, whose header block is written here (not synced).
    pub(crate) fn create(
        header: SegmentHeader,
        seg: Arc<SegmentFile>,
        compression: Compression,
    ) -> Result<Self> {
        seg.file
            .write_all_at(&header.encode(), 0)
            .map_err(io_err(&seg.path, "write segment header"))?;
        Ok(Self::empty(header, seg, compression))
    }

    /// A new active segment over the spare file (crate::spare), `size` bytes long with `header`
    /// already written, and blocks reserved up to `reserved`: its appends overwrite the file's
    /// earlier bytes, and sealing cuts the file at the trailer.
    pub(crate) fn over_spare(
        header: SegmentHeader,
        seg: Arc<SegmentFile>,
        compression: Compression,
        size: u64,
        reserved: u64,
    ) -> Self {
        Self {
            preallocated: true,
            reserved,
            sized_len: size,
            ..Self::empty(header, seg, compression)
        }
    }

    fn empty(header: SegmentHeader, seg: Arc<SegmentFile>, compression: Compression) -> Self {
        Self {
            header,
            seg,
            len: SEGMENT_HEADER_LEN as u64,
            synced_len: 0,
            entries: Vec::new(),
            unsynced_from: 0,
            unsynced: Vec::new(),
            staged: Vec::new(),
            compression,
            scratch: (Vec::new(), 0),
            preallocated: false,
            reserved: 0,
            sized_len: 0,
        }
    }

    /// An active segment recovered on open, continuing after its valid frames.
    pub(crate) fn resume(
        header: SegmentHeader,
        seg: Arc<SegmentFile>,
        len: u64,
        entries: Vec<IndexEntry>,
        compression: Compression,
    ) -> Self {
        let n = entries.len();
        Self {
            header,
            seg,
            len,
            synced_len: len,
            entries,
            unsynced_from: n,
            unsynced: Vec::new(),
            staged: Vec::new(),
            compression,
            scratch: (Vec::new(), 0),
            // It may have been preallocated before the restart.
            preallocated: true,
            reserved: 0,
            sized_len: 0,
        }
    }

    /// Encodes `records` as frames appended to the segment (one write), with consecutive
    /// sequences from `first_sequence`; returns their entries.
    pub(crate) fn append(
        &mut self,
        records: &[(RecordMeta, &[u8])],
        first_sequence: u64,
    ) -> Result<Vec<IndexEntry>> {
        self.append_with(records, |i| first_sequence + i as u64)
    }

    /// As [`Active::append`], with each record's sequence from `sequence(i)` (compaction keeps
    /// the sequences records already have).
    pub(crate) fn append_with(
        &mut self,
        records: &[(RecordMeta, &[u8])],
        sequence: impl Fn(usize) -> u64,
    ) -> Result<Vec<IndexEntry>> {
        // Frames are contiguous: the write-behind tail goes first.
        self.flush_pending()?;
        let total = records
            .iter()
            .map(|(_, p)| p.len() + FRAME_HEADER_LEN + self.header.alignment.unit())
            .sum::<usize>();
        // Direct segments are encoded at an aligned address, so the write can bypass the page
        // cache; the capacity is reserved up front, so the buffer never moves.
        // The segment's scratch buffer is reused (kept aligned for direct segments), so a put
        // neither allocates nor faults in fresh pages.
        let (mut buf, pad) = match std::mem::take(&mut self.scratch) {
            (mut kept, pad) if kept.capacity() >= pad + total => {
                kept.truncate(pad);
                (kept, pad)
            }
            _ if self.header.alignment == Alignment::Direct => write_vec(total),
            _ => (Vec::with_capacity(total), 0),
        };
        let mut out = Vec::with_capacity(records.len());
        for (i, (meta, payload)) in records.iter().enumerate() {
            let at = (buf.len() - pad) as u64;
            let h = encode_frame_after(
                &self.header,
                FrameBody::Record(meta.clone()),
                sequence(i),
                payload,
                self.compression,
                &mut buf,
                pad,
            )?;
            out.push(IndexEntry::from_frame(self.len + at, &h));
        }
        self.seg
            .file
            .write_all_at(&buf[pad..], self.len)
            .map_err(io_err(&self.seg.path, "write"))?;
        self.len += (buf.len() - pad) as u64;
        if buf.capacity() <= MAX_SCRATCH {
            self.scratch = (buf, pad);
        }
        self.entries.extend(out.iter().cloned());
        Ok(out)
    }

    /// Appends a bundle [`Encoded`] outside the writer's lock: stamps each frame header with
    /// this segment's sequence and the record sequences from `first_sequence` (payload bytes
    /// and CRCs are already in place), then writes it at once — or, when `coalesce` (manual
    /// durability) and it is small, adds it to the write-behind tail. A bundle encoded for another
    /// alignment or compression setting is refused (the caller encodes again under the lock).
    pub(crate) fn append_encoded(
        &mut self,
        enc: &mut Encoded,
        first_sequence: u64,
        coalesce: bool,
    ) -> Result<Option<Vec<IndexEntry>>> {
        if enc.alignment != self.header.alignment || enc.compression != self.header.compression {
            return Ok(None);
        }
        let mut out = Vec::with_capacity(enc.frames.len());
        for (i, (at, h)) in enc.frames.iter_mut().enumerate() {
            h.segment_sequence = self.header.sequence;
            h.record_sequence = first_sequence + i as u64;
            let start = enc.pad + *at;
            enc.buf[start..start + FRAME_HEADER_LEN].copy_from_slice(&h.encode());
            out.push(IndexEntry::from_frame(self.len + *at as u64, h));
        }
        let buf = WriteBuf::new(std::mem::take(&mut enc.buf), enc.pad);
        if let Some(back) = self.write_region(buf, coalesce)? {
            (enc.buf, enc.pad) = back.into_parts();
        }
        self.entries.extend(out.iter().cloned());
        Ok(Some(out))
    }

    /// Whether frames built in place for `alignment` ([`FrameBuf`], never compressed) fit this
    /// segment's layout.
    pub(crate) fn takes_frames(&self, alignment: Alignment) -> bool {
        self.header.alignment == alignment && !self.header.compression
    }

    /// Appends records whose frames were built in place (each [`FrameBuf::framed_for`] this
    /// segment, see [`Active::takes_frames`]): stamps each header with this segment's sequence
    /// and the record sequences from `first_sequence`, then writes the frames in one write — out
    /// of `gathered` when it holds exactly these frames (their stamped headers copied into it),
    /// else out of their own buffers (gathered here on a direct segment) — or, when `coalesce`
    /// and they are small, copies them to the write-behind tail. Returns their entries and the
    /// frames.
    pub(crate) fn append_frames(
        &mut self,
        records: Vec<(RecordMeta, FrameBuf)>,
        first_sequence: u64,
        coalesce: bool,
        gathered: Option<Gathered>,
    ) -> Result<(Vec<IndexEntry>, Vec<Arc<FrameBuf>>)> {
        let mut out = Vec::with_capacity(records.len());
        let mut frames = Vec::with_capacity(records.len());
        let mut at = 0u64;
        for (i, (meta, mut frame)) in records.into_iter().enumerate() {
            let h = frame.stamp(&meta, self.header.sequence, first_sequence + i as u64);
            out.push(IndexEntry::from_frame(self.len + at, &h));
            at += frame.frame().len() as u64;
            frames.push(Arc::new(frame));
        }
        let buf = match gathered {
            Some(g) if g.holds(&frames) => g.stamped(&frames),
            Some(other) => {
                keep_spare(other.bytes, other.pad);
                WriteBuf::frames(frames.clone())
            }
            None => WriteBuf::frames(frames.clone()),
        };
        if let Some(done) = self.write_region(buf, coalesce)?
            && !done.is_frames()
        {
            let (b, pad) = done.into_parts();
            keep_spare(b, pad);
        }
        self.entries.extend(out.iter().cloned());
        Ok((out, frames))
    }

    /// Writes `buf` at the segment's end, which it moves: when `coalesce` (manual durability)
    /// and it is small, into the write-behind tail; when `coalesce`, as a write in flight
    /// (readers find its bytes in it until it completes); else at once. Returns `buf` when it
    /// was copied or written (its memory free again).
    fn write_region(&mut self, buf: WriteBuf, coalesce: bool) -> Result<Option<WriteBuf>> {
        let len = buf.len();
        if coalesce && len < COALESCE_BELOW {
            // Gathered in the write-behind tail, where readers find it until it is written.
            {
                let mut p = self.seg.pending.write().unwrap_or_else(|e| e.into_inner());
                if p.len() == 0 {
                    if p.bytes.capacity() < p.pad + WRITE_BEHIND + COALESCE_BELOW {
                        let want = WRITE_BEHIND + COALESCE_BELOW;
                        (p.bytes, p.pad) = write_buffer(want, self.header.alignment);
                    }
                    p.start = self.len;
                }
                for part in buf.parts() {
                    p.bytes.extend_from_slice(part);
                }
            }
            self.len += len as u64;
            let full = self
                .seg
                .pending
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .len()
                >= WRITE_BEHIND;
            if full {
                self.flush_pending()?;
            }
            return Ok(Some(buf));
        }
        self.flush_pending()?;
        if coalesce && len <= MAX_SCRATCH {
            // Written asynchronously from the buffer itself; readers find the frames in it
            // until the write is known complete.
            self.bound_in_flight()?;
            let buf = match self.header.alignment {
                // Frames not gathered beforehand: here, under the writer's lock.
                Alignment::Direct if buf.is_frames() => Gathered::of(&buf),
                _ => buf,
            };
            let buf = Arc::new(buf);
            self.list_in_flight(self.len, &buf);
            self.submit_listed(buf, self.len)?;
            self.len += len as u64;
            return Ok(None);
        }
        self.seg
            .file
            .write_buf_at(&buf, 0, self.len)
            .map_err(io_err(&self.seg.path, "write"))?;
        self.len += len as u64;
        Ok(Some(buf))
    }

    /// Lists `buf` as a write in flight at `offset`, where readers find its bytes.
    fn list_in_flight(&self, offset: u64, buf: &Arc<WriteBuf>) {
        let mut p = self.seg.pending.write().unwrap_or_else(|e| e.into_inner());
        p.in_flight.push((offset, Arc::clone(buf)));
    }

    /// Stops listing the writes at `offsets` (complete) and keeps their buffers for reuse.
    fn unlist(&self, offsets: &[u64]) {
        if offsets.is_empty() {
            return;
        }
        let mut done = Vec::new();
        {
            let mut p = self.seg.pending.write().unwrap_or_else(|e| e.into_inner());
            p.in_flight.retain(|(at, buf)| {
                let complete = offsets.contains(at);
                if complete {
                    done.push(Arc::clone(buf));
                }
                !complete
            });
        }
        done.into_iter().for_each(give_spare);
    }

    /// Starts the write of `buf` (already listed in flight) at `offset`. On failure it stays
    /// listed until the caller's failure policy drops the tail ([`Active::drop_pending`]).
    fn submit_listed(&mut self, buf: Arc<WriteBuf>, offset: u64) -> Result<()> {
        self.size_ahead(offset + buf.len() as u64);
        match self.seg.file.submit_write(&buf, offset) {
            Ok(false) => Ok(()),
            Ok(true) => {
                drop(buf);
                self.unlist(&[offset]);
                Ok(())
            }
            Err(e) => Err(io_err(&self.seg.path, "write")(e)),
        }
    }

    /// Before a direct write that would end past the file's size, sets the size
    /// [`SIZE_AHEAD`] bytes further, within the blocks reserved at creation. ext4 runs a direct
    /// write that extends its file to completion before the next starts; a write inside the
    /// size runs beside the others. Sealing sets the exact size. A refusal only costs speed: it
    /// is logged, and the segment appends as before.
    fn size_ahead(&mut self, end: u64) {
        if self.header.alignment != Alignment::Direct
            || end <= self.sized_len
            || end >= self.reserved
        {
            return;
        }
        let target = end.saturating_add(SIZE_AHEAD).min(self.reserved);
        match self.seg.file.set_len(target) {
            Ok(()) => self.sized_len = target,
            Err(e) => {
                tracing::debug!(segment = self.seg.id, "cannot size the segment ahead: {e}");
                self.reserved = 0;
            }
        }
    }

    /// Whether the file's size was set ahead of the appends.
    pub(crate) fn sized_ahead(&self) -> bool {
        self.sized_len > 0
    }

    /// Waits, if needed, until fewer than [`WRITES_IN_FLIGHT`] writes are in flight.
    fn bound_in_flight(&mut self) -> Result<()> {
        let n = self
            .seg
            .pending
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .in_flight
            .len();
        if n >= WRITES_IN_FLIGHT {
            self.reap(WRITES_IN_FLIGHT - 1)?;
        }
        Ok(())
    }

    /// Waits until at most `in_flight` writes are in flight; a failed write is an error (the
    /// frames stay listed for the failure policy to drop).
    fn reap(&mut self, in_flight: usize) -> Result<()> {
        let done = self
            .seg
            .file
            .complete_writes(in_flight)
            .map_err(io_err(&self.seg.path, "write"))?;
        self.unlist(&done);
        Ok(())
    }

    /// Writes the tail and waits for every write in flight.
    pub(crate) fn write_out(&mut self) -> Result<()> {
        self.flush_pending()?;
        self.reap(0)
    }

    /// Starts writing the write-behind tail: its buffer becomes a write in flight, where
    /// readers keep finding the frames until the write is known complete.
    pub(crate) fn flush_pending(&mut self) -> Result<()> {
        let empty = self
            .seg
            .pending
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .len()
            == 0;
        if empty {
            return Ok(());
        }
        self.bound_in_flight()?;
        let (start, buf) = {
            let mut p = self.seg.pending.write().unwrap_or_else(|e| e.into_inner());
            let buf = Arc::new(WriteBuf::new(std::mem::take(&mut p.bytes), p.pad));
            p.pad = 0;
            let start = p.start;
            p.in_flight.push((start, Arc::clone(&buf)));
            (start, buf)
        };
        self.submit_listed(buf, start)
    }

    /// Forgets the write-behind tail and the writes in flight, waiting for those first (their
    /// records are lost: the failure policy, or their bytes are in the file).
    pub(crate) fn drop_pending(&mut self) {
        if let Err(e) = self.seg.file.complete_writes(0) {
            tracing::debug!(segment = self.seg.id, "writes in flight at a loss: {e}");
        }
        let in_flight = {
            let mut p = self.seg.pending.write().unwrap_or_else(|e| e.into_inner());
            let pad = p.pad;
            p.bytes.truncate(pad);
            std::mem::take(&mut p.in_flight)
        };
        in_flight.into_iter().for_each(|(_, b)| give_spare(b));
    }

    /// Makes everything appended durable.
    pub(crate) fn sync(&mut self) -> Result<()> {
        self.write_out()?;
        self.seg
            .file
            .sync()
            .map_err(io_err(&self.seg.path, "fsync"))?;
        self.synced_len = self.len;
        self.unsynced_from = self.entries.len();
        self.unsynced.clear();
        Ok(())
    }

    /// Bytes the footer and trailer would add.
    pub(crate) fn seal_overhead(&self) -> u64 {
        // One more entry and namespace summary than now, for the record about to be added.
        let entries = self.entries.len() + 1;
        (Footer::new(0, 0, Vec::new()).encoded_len()
            + entries * (orbitkv_segments::footer::INDEX_ENTRY_LEN + 48)
            + TRAILER_LEN
            + self.header.alignment.unit()) as u64
    }

    /// Writes the footer and trailer and syncs; returns the footer digest and data end.
    pub(crate) fn seal(&mut self) -> Result<([u8; 32], u64)> {
        self.write_out()?;
        let data_end = self.len;
        let footer = Footer::new(self.header.sequence, data_end, self.entries.clone()).encode();
        let trailer = Trailer {
            footer_offset: data_end,
            footer_len: footer.len() as u64,
            segment_sequence: self.header.sequence,
            footer_digest: footer_digest(&footer),
        };
        let mut tail = footer;
        let end = align_end(self.header.alignment, data_end as usize + tail.len());
        tail.resize(end - data_end as usize - TRAILER_LEN, 0);
        tail.extend_from_slice(&trailer.encode());
        self.seg
            .file
            .write_all_at(&tail, data_end)
            .map_err(io_err(&self.seg.path, "write footer"))?;
        if self.preallocated {
            // Frees the blocks reserved past the trailer.
            self.seg
                .file
                .set_len(data_end + tail.len() as u64)
                .map_err(io_err(&self.seg.path, "release preallocated blocks"))?;
        }
        self.sync()?;
        Ok((trailer.footer_digest, data_end))
    }
}

/// The file length that puts the trailer's end on the alignment unit.
fn align_end(alignment: Alignment, len_before_trailer: usize) -> usize {
    alignment.round_up(len_before_trailer + TRAILER_LEN)
}

/// Reads a sealed segment's header, trailer and footer from its tail; returns them and the bytes
/// read. With `digest` (the manifest's seal record), a trailer naming another footer is refused
/// before the footer is allocated. Errors are descriptions (the caller quarantines or reports).
pub(crate) fn read_sealed(
    file: &SegmentFile,
    digest: Option<&[u8; 32]>,
) -> std::result::Result<(SegmentHeader, Trailer, Footer, u64), String> {
    let len = file.file.size().map_err(|e| e.to_string())?;
    if len > crate::MAX_SEGMENT_FILE_BYTES {
        return Err(format!(
            "{len} bytes, more than any segment the store writes (a sparse or runaway file)"
        ));
    }
    let mut head = vec![0u8; 64.min(len as usize)];
    file.file
        .read_exact_at(&mut head, 0)
        .map_err(|e| e.to_string())?;
    let header = SegmentHeader::decode(&head).map_err(|e| format!("header: {e}"))?;
    if len < TRAILER_LEN as u64 {
        return Err("shorter than a trailer".to_owned());
    }
    let mut tail = vec![0u8; TRAILER_LEN];
    file.file
        .read_exact_at(&mut tail, len - TRAILER_LEN as u64)
        .map_err(|e| e.to_string())?;
    let t = Trailer::decode(&tail, len).map_err(|e| format!("trailer: {e}"))?;
    if digest.is_some_and(|d| t.footer_digest != *d) {
        return Err("footer digest differs from the manifest's seal record".to_owned());
    }
    // A footer longer than its frames could need is refused before anything is allocated.
    if t.footer_len > crate::recover::max_footer_len(t.footer_offset) {
        return Err(format!(
            "trailer: a footer of {} bytes is longer than {} bytes of frames can need",
            t.footer_len, t.footer_offset
        ));
    }
    let footer_len = usize::try_from(t.footer_len).map_err(|_| "footer length".to_owned())?;
    let mut footer = Vec::new();
    footer
        .try_reserve_exact(footer_len)
        .map_err(|e| format!("footer of {footer_len} bytes: {e}"))?;
    footer.resize(footer_len, 0);
    file.file
        .read_exact_at(&mut footer, t.footer_offset)
        .map_err(|e| e.to_string())?;
    let f = t
        .open_footer(&footer, header.alignment)
        .map_err(|e| format!("footer: {e}"))?;
    if f.segment_sequence != header.sequence {
        return Err("footer of another segment instance".to_owned());
    }
    let read = (head.len() + TRAILER_LEN + footer_len) as u64;
    Ok((header, t, f, read))
}

/// Reads and verifies the payload of the record `e` lists (from a footer or a scan): the frame
/// must decode, match the entry, and its CRC must verify. Errors are descriptions.
pub(crate) fn read_entry_payload(
    file: &SegmentFile,
    e: &IndexEntry,
) -> std::result::Result<Vec<u8>, EntryError> {
    let mut frame = vec![0u8; FRAME_HEADER_LEN + e.stored_len as usize];
    file.file
        .read_exact_at(&mut frame, e.offset)
        .map_err(EntryError::Io)?;
    let h = FrameHeader::decode(&frame, e.offset).map_err(|e| EntryError::Bad(e.to_string()))?;
    if h.body != e.body || h.record_sequence != e.record_sequence {
        return Err(EntryError::Bad(
            "frame differs from its footer entry".to_owned(),
        ));
    }
    h.payload(&frame[FRAME_HEADER_LEN..], e.offset)
        .map(|p| p.into_owned())
        .map_err(|e| EntryError::Bad(e.to_string()))
}

/// Why a footer entry's payload could not be had: the read failed (the bytes may be sound), or
/// the bytes read are not the record the entry names.
#[derive(Debug)]
pub(crate) enum EntryError {
    Io(std::io::Error),
    Bad(String),
}

impl std::fmt::Display for EntryError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EntryError::Io(e) => write!(f, "read failed: {e}"),
            EntryError::Bad(why) => f.write_str(why),
        }
    }
}

/// A bundle's frames, encoded by the putting thread before it takes the writer's lock (the
/// payload copy and CRC, the expensive part, run in parallel across putters); only the
/// segment and record sequences in each header are left to stamp.
pub(crate) struct Encoded {
    buf: Vec<u8>,
    pad: usize,
    /// Each frame's offset from the start of the bundle, and its header.
    frames: Vec<(usize, FrameHeader)>,
    alignment: Alignment,
    compression: bool,
}

thread_local! {
    /// Each putting thread's encode buffer, reused (kept aligned) so a put neither allocates
    /// nor faults in fresh pages.
    static ENCODE_BUF: std::cell::RefCell<(Vec<u8>, usize)> =
        const { std::cell::RefCell::new((Vec::new(), 0)) };
}

impl Encoded {
    /// Encodes `records` for segments of `alignment` and `compression`.
    pub(crate) fn new(
        records: &[(RecordMeta, &[u8])],
        alignment: Alignment,
        compression: Compression,
    ) -> Result<Self> {
        let template = SegmentHeader {
            segment_id: 0,
            sequence: 0,
            created_unix_ms: 0,
            directory_id: [0; 16],
            alignment,
            compression: compression != Compression::None,
        };
        let total = records
            .iter()
            .map(|(_, p)| p.len() + FRAME_HEADER_LEN + alignment.unit())
            .sum::<usize>();
        let (mut buf, pad) = match ENCODE_BUF.with_borrow_mut(std::mem::take) {
            (mut kept, pad)
                if kept.capacity() >= pad + total && aligned_for(&kept, pad, alignment) =>
            {
                kept.truncate(pad);
                (kept, pad)
            }
            // The thread's buffer went to a write in flight: one a completed write gave back.
            _ => write_buffer(total, alignment),
        };
        let mut frames = Vec::with_capacity(records.len());
        for (meta, payload) in records {
            let at = buf.len() - pad;
            let h = encode_frame_after(
                &template,
                FrameBody::Record(meta.clone()),
                0,
                payload,
                compression,
                &mut buf,
                pad,
            )?;
            frames.push((at, h));
        }
        Ok(Self {
            buf,
            pad,
            frames,
            alignment,
            compression: template.compression,
        })
    }

    /// Gives the buffer back to the thread for its next put (unless a write took it).
    pub(crate) fn recycle(self) {
        if self.buf.capacity() > 0 && self.buf.capacity() <= MAX_SCRATCH {
            ENCODE_BUF.with_borrow_mut(|b| *b = (self.buf, self.pad));
        }
    }

    /// Keeps the buffer (unless a write took it) for any thread's next encode: for a bundle
    /// one thread encoded and another appended.
    pub(crate) fn recycle_shared(self) {
        keep_spare(self.buf, self.pad);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A finished direct frame of `len` payload bytes, each `byte`.
    fn frame(byte: u8, len: usize) -> FrameBuf {
        let mut f = FrameBuf::new();
        let v = f.begin(Alignment::Direct, len);
        v.resize(v.len() + len, 0);
        FrameBuf::framed_test(f, byte)
    }

    #[test]
    fn frames_are_gathered_into_one_direct_buffer_in_order() {
        let frames: Vec<Arc<FrameBuf>> = [1u8, 2, 3]
            .into_iter()
            .map(|byte| Arc::new(frame(byte, 10_000 * usize::from(byte))))
            .collect();
        let expected: Vec<u8> = frames.iter().flat_map(|f| f.frame().to_vec()).collect();
        let gathered = Gathered::of(&WriteBuf::frames(frames));
        let parts: Vec<&[u8]> = gathered.parts().collect();
        assert_eq!(parts.len(), 1, "one buffer");
        assert_eq!(parts[0], expected.as_slice());
        assert!(
            (parts[0].as_ptr() as usize).is_multiple_of(crate::io::aligned::DIRECT_ALIGN),
            "a direct write's buffer"
        );
    }

    /// A buffer gathered from some frames serves only those frames: others of the same length
    /// and CRC (here the same bytes, in other memory) are not taken for them.
    #[test]
    fn a_gathered_buffer_holds_only_its_own_frames() {
        let ours = [frame(7, 20_000), frame(8, 30_000)];
        let twins = [frame(7, 20_000), frame(8, 30_000)].map(Arc::new);
        let refs: Vec<&FrameBuf> = ours.iter().collect();
        let gathered = Gathered::new(&refs, ours.iter().map(|f| f.frame().len()).sum());
        // The frames move into `Arc`s, as `append_frames` moves them; their memory does not.
        let ours = ours.map(Arc::new);
        assert!(gathered.holds(&ours));
        assert_eq!(twins[0].crc(), ours[0].crc());
        assert!(!gathered.holds(&twins));
        assert!(!gathered.holds(&ours[..1]));
    }
}
