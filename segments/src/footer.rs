//! The sealed-segment footer and trailer.
//!
//! A sealed segment ends with a footer block — one index entry per record or tombstone (everything
//! the index and the validator need, without reading payloads), counts and bytes per namespace,
//! and a CRC — followed at the very end of the file by a fixed 80-byte trailer that locates the
//! footer and carries its SHA-256. Opening a sealed segment reads only its tail.

use orbitkv_state::{Namespace, StateKey};
use sha2::{Digest, Sha256};

use crate::crc::crc32c;
use crate::error::{Checksum, Error, Result};
use crate::fixed::{self, Fixed, VersionField};
use crate::frame::{
    FRAME_HEADER_LEN, FrameBody, FrameHeader, FrameKind, META_LEN, check_lengths, decode_meta,
    encode_meta,
};
use crate::le::{
    all_zero, bytes_at, put, put_u16, put_u32, put_u64, u8_at, u16_at, u32_at, u64_at,
};
use crate::segment_header::{Alignment, SEGMENT_HEADER_LEN};

/// Footer magic.
pub const FOOTER_MAGIC: [u8; 4] = *b"OKVX";
/// Footer version.
pub const FOOTER_VERSION: u32 = 1;
/// Fixed part of the footer before the entries.
pub const FOOTER_FIXED_LEN: usize = 32;
/// Size of one index entry.
pub const INDEX_ENTRY_LEN: usize = 256;
/// Size of one namespace summary.
pub const NAMESPACE_SUMMARY_LEN: usize = 48;
/// Trailer magic.
pub const TRAILER_MAGIC: [u8; 8] = *b"OKVTRAIL";
/// Trailer version.
pub const TRAILER_VERSION: u32 = 1;
/// Size of the trailer at the end of a sealed segment.
pub const TRAILER_LEN: usize = 80;

const ENTRY_META_OFFSET: usize = 40;
const FLAG_COMPRESSED: u16 = 1;
const FLAG_PARENT: u16 = 2;

/// One record or tombstone of a sealed segment, as the footer lists it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct IndexEntry {
    /// Offset of the frame in the segment file.
    pub offset: u64,
    /// The frame's total length.
    pub frame_len: u32,
    /// Record sequence.
    pub record_sequence: u64,
    /// Stored payload length.
    pub stored_len: u32,
    /// Uncompressed payload length.
    pub uncompressed_len: u32,
    /// Payload CRC32C (so a read can be verified against the index too).
    pub payload_crc: u32,
    /// Whether the payload is compressed.
    pub compressed: bool,
    /// Record or tombstone (never padding).
    pub body: FrameBody,
}

impl IndexEntry {
    /// The entry for a frame written at `offset`.
    pub fn from_frame(offset: u64, h: &FrameHeader) -> Self {
        Self {
            offset,
            frame_len: h.frame_len,
            record_sequence: h.record_sequence,
            stored_len: h.stored_len,
            uncompressed_len: h.uncompressed_len,
            payload_crc: h.payload_crc,
            compressed: h.compressed,
            body: h.body.clone(),
        }
    }
    /// The entry's key.
    pub fn key(&self) -> Option<&StateKey> {
        self.body.key()
    }

    fn encode_into(&self, b: &mut [u8]) {
        b[0] = self.body.kind().code();
        let mut flags = 0;
        if self.compressed {
            flags |= FLAG_COMPRESSED;
        }
        if matches!(&self.body, FrameBody::Record(m) if m.parent.is_some()) {
            flags |= FLAG_PARENT;
        }
        put_u16(b, 1, flags);
        put_u32(b, 4, self.frame_len);
        put_u64(b, 8, self.offset);
        put_u64(b, 16, self.record_sequence);
        put_u32(b, 24, self.stored_len);
        put_u32(b, 28, self.uncompressed_len);
        put_u32(b, 32, self.payload_crc);
        put(b, ENTRY_META_OFFSET, &encode_meta(&self.body));
    }

    fn decode(b: &[u8], at: u64) -> Result<Self> {
        const WHAT: &str = "footer index entry";
        let invalid = |field: &'static str, reason: &str| Error::InvalidField {
            what: WHAT,
            offset: at,
            field,
            reason: reason.to_owned(),
        };
        let kind = match FrameKind::from_code(u8_at(b, 0)) {
            Some(FrameKind::Padding) | None => {
                return Err(invalid("kind", "not a record or tombstone"));
            }
            Some(k) => k,
        };
        let flags = u16_at(b, 1);
        if flags & !(FLAG_COMPRESSED | FLAG_PARENT) != 0
            || u8_at(b, 3) != 0
            || !all_zero(&b[36..40])
            || !all_zero(&b[ENTRY_META_OFFSET + META_LEN..INDEX_ENTRY_LEN])
        {
            return Err(invalid(
                "flags/reserved",
                "unknown flags or non-zero reserved bytes",
            ));
        }
        let body = decode_meta(
            kind,
            flags & FLAG_PARENT != 0,
            &b[ENTRY_META_OFFSET..ENTRY_META_OFFSET + META_LEN],
            WHAT,
            at,
        )?;
        let e = Self {
            offset: u64_at(b, 8),
            frame_len: u32_at(b, 4),
            record_sequence: u64_at(b, 16),
            stored_len: u32_at(b, 24),
            uncompressed_len: u32_at(b, 28),
            payload_crc: u32_at(b, 32),
            compressed: flags & FLAG_COMPRESSED != 0,
            body,
        };
        // The same rules a frame header obeys, so a consumer may trust the lengths it reads here.
        check_lengths(
            kind,
            e.compressed,
            e.stored_len,
            e.uncompressed_len,
            e.frame_len,
            WHAT,
            at,
        )?;
        Ok(e)
    }
}

/// Records and payload bytes of one namespace in a segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct NamespaceSummary {
    /// The namespace.
    pub namespace: Namespace,
    /// Entries (records and tombstones).
    pub records: u64,
    /// Stored payload bytes.
    pub payload_bytes: u64,
}

/// A sealed segment's footer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Footer {
    /// The segment's sequence.
    pub segment_sequence: u64,
    /// Where the frames end (the footer's own offset).
    pub data_end: u64,
    /// Every record and tombstone, in file order.
    pub entries: Vec<IndexEntry>,
    /// Per namespace, sorted by namespace.
    pub namespaces: Vec<NamespaceSummary>,
}

/// Per-namespace counts of `entries`, sorted by namespace.
pub fn summarize(entries: &[IndexEntry]) -> Vec<NamespaceSummary> {
    let mut by_ns: std::collections::BTreeMap<Namespace, (u64, u64)> = Default::default();
    for e in entries {
        if let Some(k) = e.key() {
            let s = by_ns.entry(k.namespace).or_default();
            s.0 += 1;
            s.1 += u64::from(e.stored_len);
        }
    }
    by_ns
        .into_iter()
        .map(|(namespace, (records, payload_bytes))| NamespaceSummary {
            namespace,
            records,
            payload_bytes,
        })
        .collect()
}

impl Footer {
    /// A footer for `entries` (summaries computed).
    pub fn new(segment_sequence: u64, data_end: u64, entries: Vec<IndexEntry>) -> Self {
        let namespaces = summarize(&entries);
        Self {
            segment_sequence,
            data_end,
            entries,
            namespaces,
        }
    }

    /// Encoded length.
    pub fn encoded_len(&self) -> usize {
        FOOTER_FIXED_LEN
            + self.entries.len() * INDEX_ENTRY_LEN
            + self.namespaces.len() * NAMESPACE_SUMMARY_LEN
            + 4
    }

    /// Encodes the footer block.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; self.encoded_len()];
        put(&mut b, 0, &FOOTER_MAGIC);
        put_u32(&mut b, 4, FOOTER_VERSION);
        put_u64(&mut b, 8, self.segment_sequence);
        put_u64(&mut b, 16, self.data_end);
        put_u32(&mut b, 24, self.entries.len() as u32);
        put_u32(&mut b, 28, self.namespaces.len() as u32);
        let mut at = FOOTER_FIXED_LEN;
        for e in &self.entries {
            e.encode_into(&mut b[at..at + INDEX_ENTRY_LEN]);
            at += INDEX_ENTRY_LEN;
        }
        for s in &self.namespaces {
            put(&mut b, at, &s.namespace.0);
            put_u64(&mut b, at + 32, s.records);
            put_u64(&mut b, at + 40, s.payload_bytes);
            at += NAMESPACE_SUMMARY_LEN;
        }
        let crc = crc32c(&b[..at]);
        put_u32(&mut b, at, crc);
        b
    }

    /// Decodes and verifies a footer block (`bytes` is exactly the block; `offset` its position) of
    /// a segment with `alignment`. Counts are checked against the block's length before anything
    /// is allocated; every entry obeys the frame rules, lies on the alignment grid inside the data
    /// region, after the previous one, with a larger record sequence; the namespace summaries must
    /// match the entries.
    pub fn decode(bytes: &[u8], offset: u64, alignment: Alignment) -> Result<Self> {
        const WHAT: &str = "footer";
        let min = FOOTER_FIXED_LEN + 4;
        if bytes.len() < min {
            return Err(Error::Truncated {
                what: WHAT,
                offset,
                needed: (min - bytes.len()) as u64,
            });
        }
        if bytes[..4] != FOOTER_MAGIC {
            return Err(Error::BadMagic { what: WHAT, offset });
        }
        let body_len = bytes.len() - 4;
        let version = u32_at(bytes, 4);
        let unsupported = Error::UnsupportedVersion {
            what: WHAT,
            offset,
            found: version,
            supported: FOOTER_VERSION,
        };
        let expected = u32_at(bytes, body_len);
        let actual = crc32c(&bytes[..body_len]);
        if expected != actual {
            if version != FOOTER_VERSION {
                return Err(unsupported);
            }
            return Err(Error::ChecksumMismatch {
                what: WHAT,
                kind: Checksum::Footer,
                offset,
                expected,
                actual,
            });
        }
        if version != FOOTER_VERSION {
            return Err(unsupported);
        }
        let n = u64::from(u32_at(bytes, 24));
        let m = u64::from(u32_at(bytes, 28));
        let want = FOOTER_FIXED_LEN as u64
            + n * INDEX_ENTRY_LEN as u64
            + m * NAMESPACE_SUMMARY_LEN as u64
            + 4;
        if want != bytes.len() as u64 {
            return Err(Error::LengthOutOfBounds {
                what: WHAT,
                offset,
                length: want,
                limit: bytes.len() as u64,
            });
        }
        let segment_sequence = u64_at(bytes, 8);
        let data_end = u64_at(bytes, 16);
        if data_end < SEGMENT_HEADER_LEN as u64 {
            return Err(Error::InvalidField {
                what: WHAT,
                offset,
                field: "data end",
                reason: format!("{data_end} is inside the segment header"),
            });
        }
        let mut entries = Vec::with_capacity(n as usize);
        let mut at = FOOTER_FIXED_LEN;
        let mut prev_end = SEGMENT_HEADER_LEN as u64;
        let mut prev_seq = None;
        for _ in 0..n {
            let e = IndexEntry::decode(&bytes[at..at + INDEX_ENTRY_LEN], offset + at as u64)?;
            // Entries are frames on the grid, in file order, inside the data region, and their
            // sequences increase.
            let end = e.offset.checked_add(u64::from(e.frame_len));
            let exact = e.frame_len as usize
                == alignment.round_up(FRAME_HEADER_LEN + e.stored_len as usize)
                && e.offset.is_multiple_of(alignment.unit() as u64);
            if !exact || e.offset < prev_end || end.is_none_or(|end| end > data_end) {
                return Err(Error::InvalidField {
                    what: WHAT,
                    offset: offset + at as u64,
                    field: "entry offset",
                    reason: format!("frame at {} outside or out of order", e.offset),
                });
            }
            if prev_seq.is_some_and(|p| e.record_sequence <= p) {
                return Err(Error::SequenceNotIncreasing {
                    offset: e.offset,
                    previous: prev_seq.unwrap_or_default(),
                    found: e.record_sequence,
                });
            }
            prev_seq = Some(e.record_sequence);
            prev_end = end.unwrap_or(u64::MAX);
            entries.push(e);
            at += INDEX_ENTRY_LEN;
        }
        let mut namespaces = Vec::with_capacity(m as usize);
        for _ in 0..m {
            namespaces.push(NamespaceSummary {
                namespace: Namespace(bytes_at(bytes, at)),
                records: u64_at(bytes, at + 32),
                payload_bytes: u64_at(bytes, at + 40),
            });
            at += NAMESPACE_SUMMARY_LEN;
        }
        if namespaces != summarize(&entries) {
            return Err(Error::InvalidField {
                what: WHAT,
                offset,
                field: "namespace summaries",
                reason: "do not match the entries".to_owned(),
            });
        }
        Ok(Self {
            segment_sequence,
            data_end,
            entries,
            namespaces,
        })
    }
}

/// The fixed trailer at the end of a sealed segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Trailer {
    /// Where the footer starts.
    pub footer_offset: u64,
    /// The footer's length.
    pub footer_len: u64,
    /// The segment's sequence.
    pub segment_sequence: u64,
    /// SHA-256 of the footer block; the manifest's seal record carries the same digest.
    pub footer_digest: [u8; 32],
}

/// SHA-256 of a footer block.
pub fn footer_digest(footer: &[u8]) -> [u8; 32] {
    Sha256::digest(footer).into()
}

impl Trailer {
    /// Encodes the 80-byte trailer.
    pub fn encode(&self) -> [u8; TRAILER_LEN] {
        let mut b = [0u8; TRAILER_LEN];
        put(&mut b, 0, &TRAILER_MAGIC);
        put_u32(&mut b, 8, TRAILER_VERSION);
        put_u64(&mut b, 16, self.footer_offset);
        put_u64(&mut b, 24, self.footer_len);
        put_u64(&mut b, 32, self.segment_sequence);
        put(&mut b, 40, &self.footer_digest);
        let crc = crc32c(&b[..76]);
        put_u32(&mut b, 76, crc);
        b
    }

    /// Decodes the trailer from the last [`TRAILER_LEN`] bytes of a file of `file_len` bytes and
    /// checks that the footer it locates lies between the segment header and the trailer.
    pub fn decode(bytes: &[u8], file_len: u64) -> Result<Self> {
        const WHAT: &str = "trailer";
        let offset = file_len.saturating_sub(TRAILER_LEN as u64);
        let min_file = (SEGMENT_HEADER_LEN + TRAILER_LEN) as u64;
        if file_len < min_file {
            return Err(Error::Truncated {
                what: "sealed segment",
                offset: 0,
                needed: min_file - file_len,
            });
        }
        if bytes.len() != TRAILER_LEN {
            return Err(Error::Usage(format!(
                "trailer slice of {} bytes, not {TRAILER_LEN}",
                bytes.len()
            )));
        }
        fixed::verify(
            bytes,
            offset,
            Fixed {
                what: WHAT,
                len: TRAILER_LEN,
                magic: &TRAILER_MAGIC,
                crc_at: 76,
                version: VersionField::U32(8),
                supported: TRAILER_VERSION,
            },
        )?;
        if !all_zero(&bytes[12..16]) || !all_zero(&bytes[72..76]) {
            return Err(Error::InvalidField {
                what: WHAT,
                offset,
                field: "reserved",
                reason: "must be zero".to_owned(),
            });
        }
        let t = Self {
            footer_offset: u64_at(bytes, 16),
            footer_len: u64_at(bytes, 24),
            segment_sequence: u64_at(bytes, 32),
            footer_digest: bytes_at(bytes, 40),
        };
        let end = t.footer_offset.checked_add(t.footer_len);
        if t.footer_offset < SEGMENT_HEADER_LEN as u64 || end.is_none_or(|e| e > offset) {
            return Err(Error::LengthOutOfBounds {
                what: WHAT,
                offset,
                length: t.footer_len,
                limit: offset.saturating_sub(t.footer_offset),
            });
        }
        Ok(t)
    }

    /// Verifies and decodes the footer this trailer locates (`footer` = those bytes) of a segment
    /// with `alignment` (from its header).
    pub fn open_footer(&self, footer: &[u8], alignment: Alignment) -> Result<Footer> {
        if footer.len() as u64 != self.footer_len {
            return Err(Error::Usage(format!(
                "footer slice of {} bytes, trailer says {}",
                footer.len(),
                self.footer_len
            )));
        }
        let digest = footer_digest(footer);
        if digest != self.footer_digest {
            let word = |d: &[u8; 32]| u32::from_le_bytes([d[0], d[1], d[2], d[3]]);
            return Err(Error::ChecksumMismatch {
                what: "footer",
                kind: Checksum::FooterDigest,
                offset: self.footer_offset,
                expected: word(&self.footer_digest),
                actual: word(&digest),
            });
        }
        let f = Footer::decode(footer, self.footer_offset, alignment)?;
        if f.segment_sequence != self.segment_sequence || f.data_end != self.footer_offset {
            return Err(Error::InvalidField {
                what: "footer",
                offset: self.footer_offset,
                field: "sequence/data end",
                reason: "disagree with the trailer".to_owned(),
            });
        }
        Ok(f)
    }
}
