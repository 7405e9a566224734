//! The segment header: the first 4096-byte block of every segment file. Its sequence (epoch) is
//! written into every frame, so bytes left from an earlier use of the file can never be taken
//! for current records.

use crate::crc::crc32c;
use crate::error::{Error, Result};
use crate::fixed::{self, Fixed, VersionField};
use crate::le::{all_zero, bytes_at, put, put_u32, put_u64, u32_at, u64_at};

/// Size of the header block; frames start here.
pub const SEGMENT_HEADER_LEN: usize = 4096;
/// Bytes of the block that carry fields (the rest is zero).
const FIELDS_LEN: usize = 64;
/// Magic number.
pub const SEGMENT_MAGIC: [u8; 8] = *b"ORBITKVS";
/// Segment format version.
pub const SEGMENT_VERSION: u32 = 1;
/// Alignment unit of frames in a packed segment.
pub const PACKED_ALIGN: usize = 8;
/// Alignment unit of frames in a direct-I/O segment.
pub const DIRECT_ALIGN: usize = 4096;

const FLAG_DIRECT: u32 = 1;
const FLAG_COMPRESSION: u32 = 2;
const KNOWN_FLAGS: u32 = FLAG_DIRECT | FLAG_COMPRESSION;

/// Where frames start and end, chosen per segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Alignment {
    /// Frames on 8-byte boundaries.
    Packed,
    /// Frames on 4 KiB boundaries, for O_DIRECT.
    Direct,
}

impl Alignment {
    /// The alignment unit in bytes.
    pub const fn unit(self) -> usize {
        match self {
            Alignment::Packed => PACKED_ALIGN,
            Alignment::Direct => DIRECT_ALIGN,
        }
    }
    /// `len` rounded up to the unit.
    pub const fn round_up(self, len: usize) -> usize {
        len.div_ceil(self.unit()) * self.unit()
    }
}

/// A segment's identity and options.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SegmentHeader {
    /// The segment's id (its file name).
    pub segment_id: u64,
    /// The segment instance's sequence (epoch); unique per creation, never reused.
    pub sequence: u64,
    /// Creation time, milliseconds since the Unix epoch.
    pub created_unix_ms: u64,
    /// The data directory this segment belongs to.
    pub directory_id: [u8; 16],
    /// Frame alignment.
    pub alignment: Alignment,
    /// Whether frames of this segment may carry zstd-compressed payloads.
    pub compression: bool,
}

impl SegmentHeader {
    /// Encodes the full 4096-byte header block.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; SEGMENT_HEADER_LEN];
        put(&mut b, 0, &SEGMENT_MAGIC);
        put_u32(&mut b, 8, SEGMENT_VERSION);
        let mut flags = 0;
        if self.alignment == Alignment::Direct {
            flags |= FLAG_DIRECT;
        }
        if self.compression {
            flags |= FLAG_COMPRESSION;
        }
        put_u32(&mut b, 12, flags);
        put_u64(&mut b, 16, self.segment_id);
        put_u64(&mut b, 24, self.sequence);
        put_u64(&mut b, 32, self.created_unix_ms);
        put(&mut b, 40, &self.directory_id);
        let crc = crc32c(&b[..60]);
        put_u32(&mut b, 60, crc);
        b
    }

    /// Decodes and verifies the header from the start of a segment. Only the first 64 bytes are
    /// read; the rest of the block is written as zeros and not interpreted.
    pub fn decode(bytes: &[u8]) -> Result<Self> {
        const WHAT: &str = "segment header";
        fixed::verify(
            bytes,
            0,
            Fixed {
                what: WHAT,
                len: FIELDS_LEN,
                magic: &SEGMENT_MAGIC,
                crc_at: 60,
                version: VersionField::U32(8),
                supported: SEGMENT_VERSION,
            },
        )?;
        let flags = u32_at(bytes, 12);
        if flags & !KNOWN_FLAGS != 0 || !all_zero(&bytes[56..60]) {
            return Err(Error::InvalidField {
                what: WHAT,
                offset: 0,
                field: "flags",
                reason: format!("unknown flags {flags:#x} or non-zero reserved bytes"),
            });
        }
        Ok(Self {
            segment_id: u64_at(bytes, 16),
            sequence: u64_at(bytes, 24),
            created_unix_ms: u64_at(bytes, 32),
            directory_id: bytes_at(bytes, 40),
            alignment: if flags & FLAG_DIRECT != 0 {
                Alignment::Direct
            } else {
                Alignment::Packed
            },
            compression: flags & FLAG_COMPRESSION != 0,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_every_option() {
        for alignment in [Alignment::Packed, Alignment::Direct] {
            for compression in [false, true] {
                let h = SegmentHeader {
                    segment_id: 42,
                    sequence: 7,
                    created_unix_ms: 1,
                    directory_id: [3; 16],
                    alignment,
                    compression,
                };
                let b = h.encode();
                assert_eq!(b.len(), SEGMENT_HEADER_LEN);
                assert_eq!(SegmentHeader::decode(&b).unwrap(), h);
            }
        }
        assert_eq!(Alignment::Direct.round_up(1), 4096);
        assert_eq!(Alignment::Packed.round_up(9), 16);
    }
}
