//! The verified read path: no byte reaches a caller unless its frame names exactly the indexed
//! key and sequence and its payload CRC verifies.
//!
//! A read is served from the DRAM tier only for the key and sequence the index (or a pin) names.
//! Otherwise the frame is read from its segment, or from the write-behind tail while unwritten.
//! Uncompressed payloads are checked and copied chunk by chunk as the chunks arrive.
//! A mismatch is a miss and a counted failure, and drops the record from the index.
//! An I/O error quarantines the segment.

use orbitkv_index::{Record, Tier};
use orbitkv_segments::{FRAME_HEADER_LEN, FrameBody, FrameHeader};
use orbitkv_state::StateKey;

use crate::StateStore;
use crate::active::SegmentFile;
use crate::error::Result;
use crate::io::aligned::{DIRECT_ALIGN, aligned_buffer};
use crate::stats::Stats;

/// Reader-thread buffers larger than this are freed after use.
const MAX_KEPT_READ_BUF: usize = 16 << 20;

thread_local! {
    /// Each reader thread's aligned frame buffer (grown as needed; freed after a frame over
    /// [`MAX_KEPT_READ_BUF`]) and its pad.
    static READ_BUF: std::cell::RefCell<(Vec<u8>, usize)> = const { std::cell::RefCell::new((Vec::new(), 0)) };
}

impl StateStore {
    pub(crate) fn is_quarantined(&self, id: u64) -> bool {
        self.quarantined
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .contains(&id)
    }

    /// Notes a use of the SSD record `rec` (a read, or a pin taken to read it) for the reclaim
    /// policies: its read mark, and its place in the record order.
    pub(crate) fn used(&self, rec: &Record) {
        if rec.tier != Tier::Ssd {
            return;
        }
        let id = u64::from(rec.segment);
        self.read_marks.mark(id, rec.offset);
        self.recency.touch((id, rec.offset), rec.range.start());
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
        if rec.tier == Tier::Dram {
            // Waiting for admission: served from the waiting room, or a miss once it left (the
            // entry goes then, if the room's eviction has not taken it out already).
            let Some(frame) = self.admission.read(key, rec.sequence) else {
                self.index.remove(key, Some(rec.sequence));
                return miss(self);
            };
            out.clear();
            out.extend_from_slice(frame.payload());
            Stats::add(&self.stats.dram_hits, 1);
            Stats::add(&self.stats.hits, 1);
            return Ok(Some(rec));
        }
        self.admission.used(key, u64::from(rec.stored_len));
        let id = u64::from(rec.segment);
        if self.dram.get(key, rec.sequence, out) {
            self.used(&rec);
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
        self.used(&rec);
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
