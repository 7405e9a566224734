//! Frame buffers: one record's frame laid out in place — a header gap, the payload its producer
//! copies in, zero fill to the alignment unit — so the write goes out of that buffer and the
//! DRAM tier keeps the same buffer. No payload byte is copied after the producer's own copy.
//! Layout of a frame: docs/format.md, "Frame".

use orbitkv_segments::crc::crc32c;
use orbitkv_segments::{
    Alignment, FRAME_HEADER_LEN, FrameBody, FrameHeader, MAX_PAYLOAD_LEN, RecordMeta,
};

use std::sync::Mutex;

use crate::error::{Error, Result};
use crate::io::aligned::{DIRECT_ALIGN, aligned_vec};

/// A record's bytes: a frame built in place ([`FrameBuf::begin`], [`FrameBuf::finish`]), or a
/// plain copy of a payload (the DRAM tier's copies). Its memory is reused across records.
#[derive(Debug, Default)]
pub struct FrameBuf {
    bytes: Vec<u8>,
    /// Alignment bytes before the frame.
    pad: usize,
    /// Where the payload starts, and its length.
    payload_at: usize,
    payload_len: usize,
    /// The payload's CRC32C, once finished.
    crc: u32,
    /// The alignment the frame was laid out for; `None` for a plain copy or an unfinished frame.
    framed: Option<Alignment>,
    /// Begun and not finished: the payload is everything after the header gap.
    open: bool,
}

impl FrameBuf {
    /// An empty buffer (no memory yet).
    pub fn new() -> Self {
        Self::default()
    }

    /// A plain copy of `payload` in `memory` (any buffer's memory, reused).
    pub(crate) fn copy_of(memory: Option<FrameBuf>, payload: &[u8]) -> Self {
        let mut bytes = memory.map(|m| m.bytes).unwrap_or_default();
        bytes.clear();
        bytes.extend_from_slice(payload);
        Self {
            payload_len: bytes.len(),
            bytes,
            ..Self::default()
        }
    }

    /// Starts a frame for segments of `alignment`: returns the buffer to append the payload to
    /// (up to `expected` bytes never move it). It holds the header gap already.
    pub fn begin(&mut self, alignment: Alignment, expected: usize) -> &mut Vec<u8> {
        let need = alignment.round_up(FRAME_HEADER_LEN + expected);
        let misplaced = alignment == Alignment::Direct
            && !(self.bytes.as_ptr() as usize + self.pad).is_multiple_of(DIRECT_ALIGN);
        if misplaced || self.bytes.capacity() < self.pad + need {
            (self.bytes, self.pad) = match alignment {
                Alignment::Direct => aligned_vec(need),
                Alignment::Packed => (Vec::with_capacity(need), 0),
            };
        }
        self.bytes.truncate(self.pad);
        self.bytes.resize(self.pad + FRAME_HEADER_LEN, 0);
        self.payload_at = self.pad + FRAME_HEADER_LEN;
        self.payload_len = 0;
        self.crc = 0;
        self.framed = None;
        self.open = true;
        &mut self.bytes
    }

    /// Ends the frame [`FrameBuf::begin`] started for `alignment`: the payload is what was
    /// appended since; its CRC32C is taken, and the frame filled to the alignment unit. A
    /// buffer that moved while it grew (off its alignment) is laid out again.
    pub fn finish(&mut self, alignment: Alignment) -> Result<()> {
        let len = self.bytes.len().saturating_sub(self.payload_at);
        if !self.open || len > MAX_PAYLOAD_LEN {
            return Err(Error::BadBundle(format!(
                "a payload of {len} bytes exceeds {MAX_PAYLOAD_LEN}, or no frame was begun"
            )));
        }
        let frame_len = alignment.round_up(FRAME_HEADER_LEN + len);
        if alignment == Alignment::Direct
            && !(self.bytes.as_ptr() as usize + self.pad).is_multiple_of(DIRECT_ALIGN)
        {
            let (mut moved, pad) = aligned_vec(frame_len);
            moved.extend_from_slice(&self.bytes[self.pad..]);
            (self.bytes, self.pad) = (moved, pad);
            self.payload_at = pad + FRAME_HEADER_LEN;
        }
        self.payload_len = len;
        self.open = false;
        self.crc = crc32c(self.payload());
        self.bytes.resize(self.pad + frame_len, 0);
        self.framed = Some(alignment);
        Ok(())
    }

    /// Drops what a failed copy appended; the memory stays for the next one.
    pub fn clear(&mut self) {
        self.bytes.truncate(self.pad);
        self.payload_at = self.pad;
        self.payload_len = 0;
        self.framed = None;
        self.open = false;
    }

    /// The payload (of a frame begun and not finished: everything appended so far).
    pub fn payload(&self) -> &[u8] {
        let end = if self.open {
            self.bytes.len()
        } else {
            self.payload_at + self.payload_len
        };
        self.bytes.get(self.payload_at..end).unwrap_or_default()
    }

    /// A copy in new memory laid out alike: a frame's copy starts where a frame for direct
    /// segments must, so the copy's memory can hold a frame later.
    pub(crate) fn duplicate(&self) -> FrameBuf {
        let (mut bytes, pad) = aligned_vec(self.bytes.len() - self.pad);
        bytes.extend_from_slice(&self.bytes[self.pad..]);
        FrameBuf {
            bytes,
            pad,
            payload_at: self.payload_at - self.pad + pad,
            ..*self
        }
    }

    /// Bytes of memory it holds.
    pub fn capacity(&self) -> usize {
        self.bytes.capacity()
    }

    /// Whether it holds a finished frame for segments of `alignment`.
    pub(crate) fn framed_for(&self, alignment: Alignment) -> bool {
        self.framed == Some(alignment)
    }

    /// The payload's CRC32C, taken by [`FrameBuf::finish`].
    pub(crate) fn crc(&self) -> u32 {
        self.crc
    }

    /// The frame: header, payload, fill.
    pub(crate) fn frame(&self) -> &[u8] {
        &self.bytes[self.pad..]
    }

    /// Writes the header of the record `meta`, in a segment of `sequence`, at `record_sequence`;
    /// returns it. Only for a finished frame ([`FrameBuf::framed_for`]).
    pub(crate) fn stamp(
        &mut self,
        meta: &RecordMeta,
        sequence: u64,
        record_sequence: u64,
    ) -> FrameHeader {
        let header = FrameHeader {
            body: FrameBody::Record(meta.clone()),
            compressed: false,
            segment_sequence: sequence,
            record_sequence,
            stored_len: self.payload_len as u32,
            uncompressed_len: self.payload_len as u32,
            payload_crc: self.crc,
            frame_len: (self.bytes.len() - self.pad) as u32,
        };
        self.bytes[self.pad..self.pad + FRAME_HEADER_LEN].copy_from_slice(&header.encode());
        header
    }
}

#[cfg(test)]
impl FrameBuf {
    /// `f`'s frame (begun, its payload appended) with every payload byte set to `byte`, finished.
    pub(crate) fn framed_test(mut f: FrameBuf, byte: u8) -> FrameBuf {
        let alignment = Alignment::Direct;
        let at = f.payload_at;
        f.bytes[at..].fill(byte);
        f.finish(alignment).unwrap_or_else(|e| panic!("{e}"));
        f
    }
}

/// Frame buffers of completed writes nobody else holds, for the next frames: a copy then lands
/// in memory already faulted in (the DRAM tier, when it keeps a frame, trades its own).
static SPARE_FRAMES: Mutex<Vec<FrameBuf>> = Mutex::new(Vec::new());
/// Bytes of spare frame buffers kept at most.
const SPARE_FRAME_BYTES: usize = 64 << 20;

/// A spare frame buffer, or a new one.
pub(crate) fn take_spare_frame() -> FrameBuf {
    let mut spares = SPARE_FRAMES.lock().unwrap_or_else(|e| e.into_inner());
    spares.pop().unwrap_or_default()
}

/// Keeps `frame`'s memory for a later frame, within [`SPARE_FRAME_BYTES`].
pub(crate) fn keep_spare_frame(frame: FrameBuf) {
    let mut spares = SPARE_FRAMES.lock().unwrap_or_else(|e| e.into_inner());
    let held: usize = spares.iter().map(FrameBuf::capacity).sum();
    if frame.capacity() > 0 && held + frame.capacity() <= SPARE_FRAME_BYTES {
        spares.push(frame);
    }
}

#[cfg(test)]
mod tests {
    use orbitkv_segments::Compression;
    use orbitkv_segments::SegmentHeader;
    use orbitkv_segments::frame::encode_frame_after;
    use orbitkv_state::{
        CacheGroupId, Component, FormatDigest, HashDomain, Namespace, RankSpec, StateKey,
        TokenRange,
    };

    use super::*;

    fn meta() -> RecordMeta {
        RecordMeta {
            key: StateKey::new(
                Namespace([3; 32]),
                HashDomain::SglangSha256,
                &[9; 32],
                CacheGroupId(0),
                Component::DenseKv,
                RankSpec::Rank(0),
            )
            .unwrap(),
            parent: None,
            range: TokenRange::new(0, 16).unwrap(),
            format: FormatDigest([5; 32]),
        }
    }

    /// A frame built in place is byte for byte the frame the encoder writes.
    #[test]
    fn a_frame_built_in_place_equals_the_encoded_one() {
        for alignment in [Alignment::Direct, Alignment::Packed] {
            for len in [0usize, 1, 3840, 3841, 100_000] {
                let payload: Vec<u8> = (0..len).map(|i| (i * 7 + 1) as u8).collect();
                let mut f = FrameBuf::new();
                f.begin(alignment, len).extend_from_slice(&payload);
                f.finish(alignment).unwrap();
                assert!(f.framed_for(alignment));
                assert_eq!(f.payload(), &payload[..]);
                let h = f.stamp(&meta(), 11, 42);
                let segment = SegmentHeader {
                    segment_id: 1,
                    sequence: 11,
                    created_unix_ms: 0,
                    directory_id: [0; 16],
                    alignment,
                    compression: false,
                };
                let mut out = Vec::new();
                let e = encode_frame_after(
                    &segment,
                    FrameBody::Record(meta()),
                    42,
                    &payload,
                    Compression::None,
                    &mut out,
                    0,
                )
                .unwrap();
                assert_eq!(h, e);
                assert_eq!(f.frame(), &out[..], "{alignment:?}, {len} bytes");
                if alignment == Alignment::Direct {
                    assert!((f.frame().as_ptr() as usize).is_multiple_of(DIRECT_ALIGN));
                }
            }
        }
    }

    /// A payload larger than announced moves the buffer; the frame is laid out again, aligned.
    #[test]
    fn a_buffer_that_moved_is_realigned() {
        let mut f = FrameBuf::new();
        let payload = vec![7u8; 1 << 20];
        f.begin(Alignment::Direct, 16).extend_from_slice(&payload);
        f.finish(Alignment::Direct).unwrap();
        assert!((f.frame().as_ptr() as usize).is_multiple_of(DIRECT_ALIGN));
        assert_eq!(f.payload(), &payload[..]);
        assert_eq!(f.frame().len() % DIRECT_ALIGN, 0);
        // Its memory is reused for the next frame, without moving.
        let at = f.frame().as_ptr();
        f.begin(Alignment::Direct, 1 << 20)
            .extend_from_slice(&payload);
        f.finish(Alignment::Direct).unwrap();
        assert_eq!(f.frame().as_ptr(), at);
    }

    #[test]
    fn an_unfinished_or_cleared_frame_is_not_framed() {
        let mut f = FrameBuf::new();
        f.begin(Alignment::Direct, 8).extend_from_slice(b"abc");
        assert!(!f.framed_for(Alignment::Direct));
        f.clear();
        assert!(f.payload().is_empty());
        let c = FrameBuf::copy_of(Some(f), b"xyz");
        assert_eq!(c.payload(), b"xyz");
        assert!(!c.framed_for(Alignment::Packed));
    }
}
