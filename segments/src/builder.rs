//! Assembles a segment image in memory: header block, frames, and on sealing the footer and
//! trailer. The store drives the same encoders against files; this builder serves tests, golden
//! fixtures, benchmarks and tools.

use orbitkv_state::StateKey;

use crate::error::{Error, Result};
use crate::footer::{Footer, IndexEntry, TRAILER_LEN, Trailer, footer_digest};
use crate::frame::{Compression, FrameBody, RecordMeta, encode_frame, encode_padding};
use crate::segment_header::SegmentHeader;

/// An in-memory segment under construction.
#[derive(Debug, Clone)]
pub struct SegmentBuilder {
    header: SegmentHeader,
    compression: Compression,
    buf: Vec<u8>,
    entries: Vec<IndexEntry>,
    last_sequence: Option<u64>,
}

impl SegmentBuilder {
    /// A segment with `header`; payloads are compressed per `compression` when the header allows.
    pub fn new(header: SegmentHeader, compression: Compression) -> Self {
        Self {
            header,
            compression,
            buf: header.encode(),
            entries: Vec::new(),
            last_sequence: None,
        }
    }

    /// The segment's header.
    pub fn header(&self) -> &SegmentHeader {
        &self.header
    }

    /// The bytes so far (an active segment's image).
    pub fn bytes(&self) -> &[u8] {
        &self.buf
    }

    /// Index entries so far.
    pub fn entries(&self) -> &[IndexEntry] {
        &self.entries
    }

    fn check_sequence(&self, seq: u64) -> Result<()> {
        match self.last_sequence {
            Some(p) if seq <= p => Err(Error::SequenceNotIncreasing {
                offset: self.buf.len() as u64,
                previous: p,
                found: seq,
            }),
            _ => Ok(()),
        }
    }

    fn push(&mut self, body: FrameBody, seq: u64, payload: &[u8]) -> Result<&IndexEntry> {
        self.check_sequence(seq)?;
        let offset = self.buf.len() as u64;
        let h = encode_frame(
            &self.header,
            body,
            seq,
            payload,
            self.compression,
            &mut self.buf,
        )?;
        self.last_sequence = Some(seq);
        self.entries.push(IndexEntry::from_frame(offset, &h));
        Ok(&self.entries[self.entries.len() - 1])
    }

    /// Appends a state record with record sequence `seq` (which must increase).
    pub fn append_record(
        &mut self,
        meta: RecordMeta,
        seq: u64,
        payload: &[u8],
    ) -> Result<&IndexEntry> {
        self.push(FrameBody::Record(meta), seq, payload)
    }

    /// Appends a tombstone for `key`.
    pub fn append_tombstone(&mut self, key: StateKey, seq: u64) -> Result<&IndexEntry> {
        self.push(FrameBody::Tombstone { key }, seq, &[])
    }

    /// Appends a padding frame of exactly `len` bytes.
    pub fn append_padding(&mut self, len: usize) -> Result<()> {
        encode_padding(&self.header, len, &mut self.buf)
    }

    /// Seals the segment: appends the footer and the trailer and returns the file image.
    pub fn seal(mut self) -> Vec<u8> {
        let data_end = self.buf.len() as u64;
        let footer = Footer::new(self.header.sequence, data_end, self.entries).encode();
        let trailer = Trailer {
            footer_offset: data_end,
            footer_len: footer.len() as u64,
            segment_sequence: self.header.sequence,
            footer_digest: footer_digest(&footer),
        };
        self.buf.extend_from_slice(&footer);
        // Direct-I/O segments end on a unit boundary: zero fill before the trailer.
        let end = self.header.alignment.round_up(self.buf.len() + TRAILER_LEN);
        self.buf.resize(end - TRAILER_LEN, 0);
        self.buf.extend_from_slice(&trailer.encode());
        self.buf
    }
}
