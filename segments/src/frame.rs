//! Frames: one record each (state record, tombstone, or padding), a fixed 256-byte header then
//! the payload, the whole frame rounded up to the segment's alignment unit.
//!
//! The header CRC covers every header field, so a length is never trusted before the CRC over it
//! verified; the payload CRC covers the stored payload bytes (compressed bytes when compressed).
//! Byte tables: docs/format.md, "Frame".
//! It is long because the 256-byte header is encoded and decoded field by field in one place,
//! each field beside its check.

use std::borrow::Cow;

use orbitkv_state::{CacheGroupId, Component, FormatDigest, RankSpec, StateKey, TokenRange};

use crate::crc::{copy_with_crc32c, crc32c, crc32c_append};
use crate::error::{Checksum, Error, Result};
use crate::fixed::{self, Fixed, VersionField};
use crate::le::{
    all_zero, bytes_at, put, put_u16, put_u32, put_u64, u8_at, u16_at, u32_at, u64_at,
};
use crate::segment_header::SegmentHeader;

/// Frame magic.
pub const FRAME_MAGIC: [u8; 4] = *b"OKVF";
/// Frame format version.
pub const FRAME_VERSION: u8 = 1;
/// Size of a frame header.
pub const FRAME_HEADER_LEN: usize = 256;
/// Largest payload (stored or uncompressed) a frame may carry: 64 MiB.
pub const MAX_PAYLOAD_LEN: usize = 64 << 20;
/// Room for one encoded StateKey (32-byte namespace + the longest key hash).
pub const KEY_FIELD_LEN: usize = 76;
/// Size of the record-metadata block shared by frame headers and footer index entries.
pub const META_LEN: usize = 212;
/// Where the metadata block sits in a frame header.
pub(crate) const META_OFFSET: usize = 40;

const FLAG_COMPRESSED: u16 = 1;
const FLAG_PARENT: u16 = 2;
const KNOWN_FLAGS: u16 = FLAG_COMPRESSED | FLAG_PARENT;

/// What a frame holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FrameKind {
    /// A state record with its payload.
    Record,
    /// Removal of a key (no payload).
    Tombstone,
    /// Filler up to an alignment boundary (zero payload).
    Padding,
}

impl FrameKind {
    /// One-byte code.
    pub const fn code(self) -> u8 {
        match self {
            FrameKind::Record => 1,
            FrameKind::Tombstone => 2,
            FrameKind::Padding => 3,
        }
    }
    pub(crate) fn from_code(code: u8) -> Option<Self> {
        match code {
            1 => Some(FrameKind::Record),
            2 => Some(FrameKind::Tombstone),
            3 => Some(FrameKind::Padding),
            _ => None,
        }
    }
}

/// What the index and the validator need to know about a state record, without its payload.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RecordMeta {
    /// The record's key (carries group, component and rank).
    pub key: StateKey,
    /// The parent record's key, when the engine's hash chain has one.
    pub parent: Option<StateKey>,
    /// Tokens the record covers.
    pub range: TokenRange,
    /// The StateFormat digest of the payload bytes.
    pub format: FormatDigest,
}

impl RecordMeta {
    /// The record's cache group.
    pub fn group(&self) -> CacheGroupId {
        self.key.hash.group()
    }
    /// The record's component.
    pub fn component(&self) -> Component {
        self.key.hash.component()
    }
    /// The record's rank.
    pub fn rank(&self) -> RankSpec {
        self.key.hash.rank()
    }
}

/// A frame's content, by kind.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum FrameBody {
    /// A state record.
    Record(RecordMeta),
    /// A tombstone for `key`.
    Tombstone {
        /// The removed key.
        key: StateKey,
    },
    /// Padding.
    Padding,
}

impl FrameBody {
    /// The frame kind.
    pub fn kind(&self) -> FrameKind {
        match self {
            FrameBody::Record(_) => FrameKind::Record,
            FrameBody::Tombstone { .. } => FrameKind::Tombstone,
            FrameBody::Padding => FrameKind::Padding,
        }
    }
    /// The key, for records and tombstones.
    pub fn key(&self) -> Option<&StateKey> {
        match self {
            FrameBody::Record(m) => Some(&m.key),
            FrameBody::Tombstone { key } => Some(key),
            FrameBody::Padding => None,
        }
    }
}

/// A decoded, checksum-verified frame header.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct FrameHeader {
    /// Content.
    pub body: FrameBody,
    /// Whether the stored payload is zstd-compressed.
    pub compressed: bool,
    /// The segment instance's sequence (must equal the segment header's).
    pub segment_sequence: u64,
    /// The record sequence (store-wide, increasing; zero for padding).
    pub record_sequence: u64,
    /// Stored payload bytes after the header.
    pub stored_len: u32,
    /// Payload bytes once decompressed (equal to `stored_len` when not compressed).
    pub uncompressed_len: u32,
    /// CRC32C over the stored payload bytes.
    pub payload_crc: u32,
    /// Header + payload + alignment fill.
    pub frame_len: u32,
}

fn put_key(b: &mut [u8], len_at: usize, key_at: usize, key: &StateKey) {
    let enc = key.encode();
    b[len_at] = enc.len() as u8;
    put(b, key_at, &enc);
}

/// Encodes the metadata block (docs/format.md, "Record metadata block").
pub(crate) fn encode_meta(body: &FrameBody) -> [u8; META_LEN] {
    let mut m = [0u8; META_LEN];
    match body {
        FrameBody::Record(r) => {
            put_u64(&mut m, 0, r.range.start());
            put_u64(&mut m, 8, r.range.end());
            put_u32(&mut m, 16, r.group().0);
            m[20] = r.component().code();
            put_key(&mut m, 21, 60, &r.key);
            if let Some(p) = &r.parent {
                put_key(&mut m, 22, 136, p);
            }
            put_u32(&mut m, 24, r.rank().code());
            put(&mut m, 28, &r.format.0);
        }
        FrameBody::Tombstone { key } => {
            put_u32(&mut m, 16, key.hash.group().0);
            m[20] = key.hash.component().code();
            put_key(&mut m, 21, 60, key);
            put_u32(&mut m, 24, key.hash.rank().code());
        }
        FrameBody::Padding => {}
    }
    m
}

fn invalid(
    what: &'static str,
    offset: u64,
    field: &'static str,
    reason: impl Into<String>,
) -> Error {
    Error::InvalidField {
        what,
        offset,
        field,
        reason: reason.into(),
    }
}

fn decode_key(
    m: &[u8],
    len_at: usize,
    key_at: usize,
    what: &'static str,
    offset: u64,
    field: &'static str,
) -> Result<Option<StateKey>> {
    let len = usize::from(u8_at(m, len_at));
    if len == 0 {
        return if all_zero(&m[key_at..key_at + KEY_FIELD_LEN]) {
            Ok(None)
        } else {
            Err(invalid(
                what,
                offset,
                field,
                "absent key with non-zero bytes",
            ))
        };
    }
    if len > KEY_FIELD_LEN || !all_zero(&m[key_at + len..key_at + KEY_FIELD_LEN]) {
        return Err(invalid(
            what,
            offset,
            field,
            format!("bad key length {len}"),
        ));
    }
    StateKey::decode(&m[key_at..key_at + len])
        .map(Some)
        .map_err(|e| invalid(what, offset, field, e.to_string()))
}

/// Decodes the metadata block for a frame of `kind`; `has_parent` is the frame's parent flag.
pub(crate) fn decode_meta(
    kind: FrameKind,
    has_parent: bool,
    m: &[u8],
    what: &'static str,
    offset: u64,
) -> Result<FrameBody> {
    if m.len() < META_LEN {
        return Err(Error::Truncated {
            what,
            offset,
            needed: (META_LEN - m.len()) as u64,
        });
    }
    if u8_at(m, 23) != 0 {
        return Err(invalid(what, offset, "reserved", "must be zero"));
    }
    match kind {
        FrameKind::Padding => {
            if has_parent || !all_zero(&m[..META_LEN]) {
                return Err(invalid(what, offset, "padding", "metadata must be zero"));
            }
            Ok(FrameBody::Padding)
        }
        FrameKind::Record | FrameKind::Tombstone => {
            let key = decode_key(m, 21, 60, what, offset, "key")?
                .ok_or_else(|| invalid(what, offset, "key", "missing"))?;
            let group = u32_at(m, 16);
            let component = u8_at(m, 20);
            let rank = u32_at(m, 24);
            if group != key.hash.group().0
                || component != key.hash.component().code()
                || rank != key.hash.rank().code()
            {
                return Err(invalid(
                    what,
                    offset,
                    "group/component/rank",
                    "differ from the key's",
                ));
            }
            let parent = decode_key(m, 22, 136, what, offset, "parent key")?;
            if parent.is_some() != has_parent {
                return Err(invalid(
                    what,
                    offset,
                    "parent key",
                    "presence differs from the flag",
                ));
            }
            if kind == FrameKind::Tombstone {
                if parent.is_some() || !all_zero(&m[..16]) || !all_zero(&m[28..60]) {
                    return Err(invalid(what, offset, "tombstone", "carries only a key"));
                }
                return Ok(FrameBody::Tombstone { key });
            }
            let range = TokenRange::new(u64_at(m, 0), u64_at(m, 8))
                .map_err(|e| invalid(what, offset, "token range", e.to_string()))?;
            Ok(FrameBody::Record(RecordMeta {
                key,
                parent,
                range,
                format: FormatDigest(bytes_at(m, 28)),
            }))
        }
    }
}

/// The length and kind rules shared by frame headers and footer index entries: lengths within
/// [`MAX_PAYLOAD_LEN`], one length unless compressed, only records compressed, tombstones without
/// payload, and a frame long enough for its header and payload, on an 8-byte multiple.
pub(crate) fn check_lengths(
    kind: FrameKind,
    compressed: bool,
    stored_len: u32,
    uncompressed_len: u32,
    frame_len: u32,
    what: &'static str,
    offset: u64,
) -> Result<()> {
    let limit = MAX_PAYLOAD_LEN as u64;
    for len in [stored_len, uncompressed_len] {
        if u64::from(len) > limit {
            return Err(Error::LengthOutOfBounds {
                what,
                offset,
                length: u64::from(len),
                limit,
            });
        }
    }
    let min_frame = FRAME_HEADER_LEN as u64 + u64::from(stored_len);
    if u64::from(frame_len) < min_frame || !frame_len.is_multiple_of(8) {
        return Err(Error::LengthOutOfBounds {
            what,
            offset,
            length: u64::from(frame_len),
            limit: min_frame,
        });
    }
    if !compressed && stored_len != uncompressed_len {
        return Err(invalid(
            what,
            offset,
            "lengths",
            "uncompressed payload with two lengths",
        ));
    }
    if compressed && kind != FrameKind::Record {
        return Err(invalid(
            what,
            offset,
            "flags",
            "only records are compressed",
        ));
    }
    if kind == FrameKind::Tombstone && stored_len != 0 {
        return Err(invalid(
            what,
            offset,
            "payload",
            "a tombstone has no payload",
        ));
    }
    Ok(())
}

impl FrameHeader {
    /// Encodes the 256-byte header, computing its CRC.
    pub fn encode(&self) -> [u8; FRAME_HEADER_LEN] {
        let mut b = [0u8; FRAME_HEADER_LEN];
        put(&mut b, 0, &FRAME_MAGIC);
        b[4] = FRAME_VERSION;
        b[5] = self.body.kind().code();
        let mut flags = 0;
        if self.compressed {
            flags |= FLAG_COMPRESSED;
        }
        if matches!(&self.body, FrameBody::Record(m) if m.parent.is_some()) {
            flags |= FLAG_PARENT;
        }
        put_u16(&mut b, 6, flags);
        put_u64(&mut b, 8, self.segment_sequence);
        put_u64(&mut b, 16, self.record_sequence);
        put_u32(&mut b, 24, self.stored_len);
        put_u32(&mut b, 28, self.uncompressed_len);
        put_u32(&mut b, 32, self.payload_crc);
        put_u32(&mut b, 36, self.frame_len);
        put(&mut b, META_OFFSET, &encode_meta(&self.body));
        let crc = crc32c(&b[..252]);
        put_u32(&mut b, 252, crc);
        b
    }

    /// Decodes and verifies a header at the start of `bytes`; `offset` is its position in the
    /// segment, for errors. Checks magic, version, the header CRC (before any length is used),
    /// known kind and flags, length limits and every field's consistency.
    pub fn decode(bytes: &[u8], offset: u64) -> Result<Self> {
        const WHAT: &str = "frame";
        fixed::verify(
            bytes,
            offset,
            Fixed {
                what: WHAT,
                len: FRAME_HEADER_LEN,
                magic: &FRAME_MAGIC,
                crc_at: 252,
                version: VersionField::U8(4),
                supported: u32::from(FRAME_VERSION),
            },
        )?;
        let kind = FrameKind::from_code(bytes[5])
            .ok_or_else(|| invalid(WHAT, offset, "kind", format!("unknown kind {}", bytes[5])))?;
        let flags = u16_at(bytes, 6);
        if flags & !KNOWN_FLAGS != 0 {
            return Err(invalid(
                WHAT,
                offset,
                "flags",
                format!("unknown flags {flags:#x}"),
            ));
        }
        let compressed = flags & FLAG_COMPRESSED != 0;
        let stored_len = u32_at(bytes, 24);
        let uncompressed_len = u32_at(bytes, 28);
        let frame_len = u32_at(bytes, 36);
        check_lengths(
            kind,
            compressed,
            stored_len,
            uncompressed_len,
            frame_len,
            WHAT,
            offset,
        )?;
        let record_sequence = u64_at(bytes, 16);
        if kind == FrameKind::Padding && record_sequence != 0 {
            return Err(invalid(WHAT, offset, "record sequence", "padding has none"));
        }
        let body = decode_meta(
            kind,
            flags & FLAG_PARENT != 0,
            &bytes[META_OFFSET..META_OFFSET + META_LEN],
            WHAT,
            offset,
        )?;
        Ok(Self {
            body,
            compressed,
            segment_sequence: u64_at(bytes, 8),
            record_sequence,
            stored_len,
            uncompressed_len,
            payload_crc: u32_at(bytes, 32),
            frame_len,
        })
    }

    /// Checks the stored payload's CRC. `stored` must be exactly the stored payload.
    pub fn verify_payload(&self, stored: &[u8], offset: u64) -> Result<()> {
        if stored.len() != self.stored_len as usize {
            return Err(Error::Usage(format!(
                "payload slice of {} bytes for a frame storing {}",
                stored.len(),
                self.stored_len
            )));
        }
        self.check_payload_crc(crc32c(stored), offset)
    }

    /// Checks a CRC32C computed over the stored payload (by a caller that checksums as the
    /// bytes arrive) against the header's.
    pub fn check_payload_crc(&self, actual: u32, offset: u64) -> Result<()> {
        if actual != self.payload_crc {
            return Err(Error::ChecksumMismatch {
                what: "frame",
                kind: Checksum::Payload,
                offset,
                expected: self.payload_crc,
                actual,
            });
        }
        Ok(())
    }

    /// Copies the payload into `dst` (exactly `uncompressed_len` bytes), verifying the CRC in the
    /// same pass; compressed payloads are verified, then decompressed straight into `dst`. On any
    /// error `dst` must be treated as garbage: nothing was verified.
    pub fn copy_payload(&self, stored: &[u8], dst: &mut [u8], offset: u64) -> Result<()> {
        if dst.len() != self.uncompressed_len as usize || stored.len() != self.stored_len as usize {
            return Err(Error::Usage(format!(
                "buffers of {}/{} bytes for a frame of {}/{}",
                stored.len(),
                dst.len(),
                self.stored_len,
                self.uncompressed_len
            )));
        }
        if self.compressed {
            self.verify_payload(stored, offset)?;
            let n =
                zstd::bulk::decompress_to_buffer(stored, dst).map_err(|e| Error::Decompress {
                    offset,
                    reason: e.to_string(),
                })?;
            if n != dst.len() {
                return Err(Error::Decompress {
                    offset,
                    reason: format!("{n} bytes, header says {}", dst.len()),
                });
            }
            return Ok(());
        }
        let actual = copy_with_crc32c(stored, dst).unwrap_or(!self.payload_crc);
        self.check_payload_crc(actual, offset)
    }

    /// As [`FrameHeader::copy_payload`], into `out` (replacing its contents) without first
    /// zero-filling it: each chunk is appended and checksummed while in cache. On a mismatch
    /// `out` is left empty.
    pub fn append_payload(&self, stored: &[u8], out: &mut Vec<u8>, offset: u64) -> Result<()> {
        out.clear();
        if self.compressed {
            out.resize(self.uncompressed_len as usize, 0);
            let r = self.copy_payload(stored, out, offset);
            if r.is_err() {
                out.clear();
            }
            return r;
        }
        if stored.len() != self.stored_len as usize {
            return Err(Error::Usage(format!(
                "a buffer of {} bytes for a frame of {}",
                stored.len(),
                self.stored_len
            )));
        }
        out.reserve(stored.len());
        let mut crc = 0u32;
        for chunk in stored.chunks(64 << 10) {
            let at = out.len();
            out.extend_from_slice(chunk);
            crc = crc32c_append(crc, &out[at..]);
        }
        let r = self.check_payload_crc(crc, offset);
        if r.is_err() {
            out.clear();
        }
        r
    }

    /// The verified, decompressed payload (borrowed when it was stored uncompressed).
    pub fn payload<'a>(&self, stored: &'a [u8], offset: u64) -> Result<Cow<'a, [u8]>> {
        if !self.compressed {
            self.verify_payload(stored, offset)?;
            return Ok(Cow::Borrowed(stored));
        }
        let mut out = vec![0u8; self.uncompressed_len as usize];
        self.copy_payload(stored, &mut out, offset)?;
        Ok(Cow::Owned(out))
    }
}

/// How a writer treats payload compression.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    /// Store payloads as they are.
    None,
    /// Try zstd at `level`; keep the result only when it saves at least 1/16 of the bytes.
    Zstd {
        /// zstd level (1 is fast).
        level: i32,
    },
}

/// Appends one frame to `out` (which must end on an alignment boundary of `segment`), copying
/// the payload and computing its CRC in one pass. Returns the header written.
pub fn encode_frame(
    segment: &SegmentHeader,
    body: FrameBody,
    record_sequence: u64,
    payload: &[u8],
    compression: Compression,
    out: &mut Vec<u8>,
) -> Result<FrameHeader> {
    encode_frame_after(segment, body, record_sequence, payload, compression, out, 0)
}

/// As [`encode_frame`], for a buffer whose frames start at `region_start` (bytes before it are
/// not part of the segment: padding that puts the frames on an aligned address for direct I/O).
/// `out.len() - region_start` must be on an alignment boundary.
pub fn encode_frame_after(
    segment: &SegmentHeader,
    body: FrameBody,
    record_sequence: u64,
    payload: &[u8],
    compression: Compression,
    out: &mut Vec<u8>,
    region_start: usize,
) -> Result<FrameHeader> {
    let unit = segment.alignment.unit();
    if out.len() < region_start || !(out.len() - region_start).is_multiple_of(unit) {
        return Err(Error::Usage(
            "frames start on an alignment boundary".to_owned(),
        ));
    }
    match (&body, payload.is_empty()) {
        (FrameBody::Padding, _) => {
            return Err(Error::Usage(
                "use encode_padding for padding frames".to_owned(),
            ));
        }
        (FrameBody::Tombstone { .. }, false) => {
            return Err(Error::Usage("a tombstone has no payload".to_owned()));
        }
        _ => {}
    }
    if payload.len() > MAX_PAYLOAD_LEN {
        return Err(Error::LengthOutOfBounds {
            what: "frame",
            offset: out.len() as u64,
            length: payload.len() as u64,
            limit: MAX_PAYLOAD_LEN as u64,
        });
    }
    let compressed = match compression {
        Compression::Zstd { level } if segment.compression && !payload.is_empty() => {
            zstd::bulk::compress(payload, level)
                .ok()
                .filter(|c| c.len() <= payload.len() - payload.len() / 16)
        }
        _ => None,
    };
    let stored: &[u8] = compressed.as_deref().unwrap_or(payload);
    let frame_len = segment.alignment.round_up(FRAME_HEADER_LEN + stored.len());
    let start = out.len();
    out.reserve(frame_len);
    out.extend_from_slice(&[0u8; FRAME_HEADER_LEN]);
    let payload_at = out.len();
    // Copy and checksum in one pass: each step is CRC'd while still in cache.
    let mut payload_crc = 0u32;
    for chunk in stored.chunks(64 << 10) {
        let at = out.len();
        out.extend_from_slice(chunk);
        payload_crc = crc32c_append(payload_crc, &out[at..]);
    }
    out.resize(start + frame_len, 0);
    let header = FrameHeader {
        body,
        compressed: compressed.is_some(),
        segment_sequence: segment.sequence,
        record_sequence,
        stored_len: stored.len() as u32,
        uncompressed_len: payload.len() as u32,
        payload_crc,
        frame_len: frame_len as u32,
    };
    out[start..payload_at].copy_from_slice(&header.encode());
    Ok(header)
}

/// Appends a padding frame of exactly `len` bytes (at least one header, a multiple of the
/// segment's unit), e.g. to reach an alignment boundary before a footer.
pub fn encode_padding(segment: &SegmentHeader, len: usize, out: &mut Vec<u8>) -> Result<()> {
    let unit = segment.alignment.unit();
    if len < FRAME_HEADER_LEN || !len.is_multiple_of(unit) || !out.len().is_multiple_of(unit) {
        return Err(Error::Usage(format!(
            "padding of {len} bytes: at least {FRAME_HEADER_LEN} and a multiple of {unit}"
        )));
    }
    let stored = len - FRAME_HEADER_LEN;
    if stored > MAX_PAYLOAD_LEN {
        return Err(Error::Usage(
            "padding larger than a payload may be".to_owned(),
        ));
    }
    let start = out.len();
    out.resize(start + len, 0);
    let header = FrameHeader {
        body: FrameBody::Padding,
        compressed: false,
        segment_sequence: segment.sequence,
        record_sequence: 0,
        stored_len: stored as u32,
        uncompressed_len: stored as u32,
        payload_crc: crc32c(&out[start + FRAME_HEADER_LEN..]),
        frame_len: len as u32,
    };
    out[start..start + FRAME_HEADER_LEN].copy_from_slice(&header.encode());
    Ok(())
}
