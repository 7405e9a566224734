//! The scanner: walks a segment's frames and says why it stopped.
//!
//! It yields every frame whose header and payload checksums verified, in order. On a bad frame it
//! searches forward (in alignment units) for the next valid frame *of this segment's sequence*:
//! if one exists, the bad frame is reported as corruption of that record and scanning resumes
//! there, so later records are not lost; if none does, the bad bytes are a **torn tail**. A frame
//! that verifies but repeats or goes back in record sequence (a duplicated frame) is reported and
//! skipped. Two modes:
//!
//! - [`ScanMode::TolerateTail`] (recovery of the active segment): a torn tail, or unwritten
//!   (zero) bytes after the last frame, end the scan normally;
//! - [`ScanMode::Strict`] (sealed segments, fsck): the frames must fill the region exactly;
//!   anything else at the end is reported as corruption.
//!
//! The scanner never allocates from a length it has not verified and never panics. A bad frame
//! whose header verified is skipped whole (no frame is looked for inside its payload). Finding the
//! next frame is linear in the bytes searched for damaged data; only bytes crafted with valid
//! checksums can make it verify many candidate payloads.

use std::ops::Range;

use crate::error::Error;
use crate::frame::{FRAME_HEADER_LEN, FRAME_MAGIC, FrameBody, FrameHeader};
use crate::le::all_zero;
use crate::segment_header::{SEGMENT_HEADER_LEN, SegmentHeader};

/// How to treat the end of the region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScanMode {
    /// Active segment: a torn tail or zero fill ends the scan cleanly.
    TolerateTail,
    /// Sealed segment or fsck: frames must end exactly at the end of the region.
    Strict,
}

/// A verified frame: its header and where its stored payload lies in the scanned bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrameRef {
    /// Offset of the frame in the segment.
    pub offset: u64,
    /// The verified header.
    pub header: FrameHeader,
    /// The stored payload's range in the scanned slice (already CRC-verified).
    pub payload: Range<usize>,
}

/// One step of a scan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScanItem {
    /// A valid frame.
    Frame(FrameRef),
    /// Bytes at `offset` are not a valid current frame, but a valid one follows at `resumed_at`.
    Corrupt {
        /// Where the bad frame starts.
        offset: u64,
        /// What was wrong.
        error: Error,
        /// Where scanning resumed.
        resumed_at: u64,
    },
}

/// Why the scan stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopReason {
    /// The frames end exactly at the end of the region (or, tolerating the tail, are followed
    /// only by unwritten zero bytes).
    CleanEnd,
    /// TolerateTail: the bytes after the last valid frame are an incomplete write (no valid frame
    /// of this segment follows); `error` says what they looked like.
    TornTail {
        /// What the first bad frame showed.
        error: Error,
    },
    /// Strict: the region does not end with a valid frame.
    Corrupt {
        /// What the first bad bytes showed.
        error: Error,
    },
}

/// The end of a scan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScanEnd {
    /// Why it stopped.
    pub reason: StopReason,
    /// Where the valid frames end (a torn tail is truncated here).
    pub valid_len: u64,
}

/// Iterates the frames of one segment region.
#[derive(Debug)]
pub struct Scanner<'a> {
    bytes: &'a [u8],
    header: SegmentHeader,
    mode: ScanMode,
    pos: usize,
    last_sequence: Option<u64>,
    end: Option<ScanEnd>,
    pending: Option<FrameRef>,
}

impl<'a> Scanner<'a> {
    /// Scans `bytes`, the segment from offset 0 (header block included) to the end of the region
    /// to scan: the written length of an active segment, or the footer offset of a sealed one.
    /// A region shorter than the header block ends the scan at once (torn when tolerating).
    pub fn new(bytes: &'a [u8], header: SegmentHeader, mode: ScanMode) -> Self {
        let end = (bytes.len() < SEGMENT_HEADER_LEN).then(|| {
            let error = Error::Truncated {
                what: "segment header block",
                offset: 0,
                needed: (SEGMENT_HEADER_LEN - bytes.len()) as u64,
            };
            ScanEnd {
                reason: match mode {
                    ScanMode::TolerateTail => StopReason::TornTail { error },
                    ScanMode::Strict => StopReason::Corrupt { error },
                },
                valid_len: bytes.len() as u64,
            }
        });
        Self {
            bytes,
            header,
            mode,
            pos: SEGMENT_HEADER_LEN.min(bytes.len()),
            last_sequence: None,
            end,
            pending: None,
        }
    }

    /// Why the scan stopped, once the iterator is exhausted.
    pub fn end(&self) -> Option<&ScanEnd> {
        self.end.as_ref()
    }

    /// The last record sequence seen (to continue the store's sequence after recovery).
    pub fn last_sequence(&self) -> Option<u64> {
        self.last_sequence
    }

    /// Scans to the end, returning every item and the end.
    pub fn run(mut self) -> (Vec<ScanItem>, ScanEnd) {
        let items: Vec<ScanItem> = self.by_ref().collect();
        let end = self.end.unwrap_or(ScanEnd {
            reason: StopReason::CleanEnd,
            valid_len: self.pos as u64,
        });
        (items, end)
    }

    /// Decodes and fully verifies the frame at `pos` (header, segment sequence, alignment, length,
    /// payload CRC; a padding payload must be zero). Does not check record-sequence order. On
    /// failure, says how far to skip when the header itself verified (its length is then known).
    fn frame_at(&self, pos: usize) -> Result<FrameRef, (Error, Option<usize>)> {
        let offset = pos as u64;
        let rest = self.bytes.get(pos..).unwrap_or_default();
        let h = FrameHeader::decode(rest, offset).map_err(|e| (e, None))?;
        // The header verified: a later frame cannot start inside this one's extent.
        let skip = Some(h.frame_len as usize).filter(|&l| l <= rest.len());
        let fail = |e: Error| (e, skip);
        if h.segment_sequence != self.header.sequence {
            return Err(fail(Error::StaleSequence {
                offset,
                expected: self.header.sequence,
                found: h.segment_sequence,
            }));
        }
        let align = self.header.alignment;
        let exact = match h.body {
            FrameBody::Padding => (h.frame_len as usize).is_multiple_of(align.unit()),
            _ => h.frame_len as usize == align.round_up(FRAME_HEADER_LEN + h.stored_len as usize),
        };
        if !exact {
            return Err(fail(Error::InvalidField {
                what: "frame",
                offset,
                field: "frame length",
                reason: format!("{} does not fit the segment's alignment", h.frame_len),
            }));
        }
        if h.compressed && !self.header.compression {
            return Err(fail(Error::InvalidField {
                what: "frame",
                offset,
                field: "flags",
                reason: "compressed payload in a segment without compression".to_owned(),
            }));
        }
        if h.frame_len as usize > rest.len() {
            return Err(fail(Error::Truncated {
                what: "frame",
                offset,
                needed: (h.frame_len as usize - rest.len()) as u64,
            }));
        }
        let payload = pos + FRAME_HEADER_LEN..pos + FRAME_HEADER_LEN + h.stored_len as usize;
        let stored = &self.bytes[payload.clone()];
        h.verify_payload(stored, offset).map_err(fail)?;
        if matches!(h.body, FrameBody::Padding) && !all_zero(stored) {
            return Err(fail(Error::InvalidField {
                what: "frame",
                offset,
                field: "padding",
                reason: "payload must be zero".to_owned(),
            }));
        }
        Ok(FrameRef {
            offset,
            header: h,
            payload,
        })
    }

    /// The next valid frame of this segment after the bad one at `from` (skipping `skip` bytes
    /// when the bad frame's header verified, else one alignment unit at a time).
    fn resync(&self, from: usize, skip: Option<usize>) -> Option<FrameRef> {
        let unit = self.header.alignment.unit();
        let mut q = from + skip.unwrap_or(unit).max(unit);
        while q + FRAME_HEADER_LEN <= self.bytes.len() {
            if self.bytes[q..q + 4] == FRAME_MAGIC
                && let Ok(frame) = self.frame_at(q)
            {
                return Some(frame);
            }
            q += unit;
        }
        None
    }

    fn stop(&mut self, reason: StopReason) -> Option<ScanItem> {
        self.end = Some(ScanEnd {
            reason,
            valid_len: self.pos as u64,
        });
        None
    }
}

impl Iterator for Scanner<'_> {
    type Item = ScanItem;

    fn next(&mut self) -> Option<ScanItem> {
        if self.end.is_some() {
            return None;
        }
        if self.pos >= self.bytes.len() {
            return self.stop(StopReason::CleanEnd);
        }
        let pos = self.pos;
        // A frame found by the last resynchronisation is already verified.
        let found = match self.pending.take() {
            Some(frame) if frame.offset as usize == pos => Ok(frame),
            _ => self.frame_at(pos),
        };
        match found {
            Ok(frame) => {
                let next = pos + frame.header.frame_len as usize;
                if !matches!(frame.header.body, FrameBody::Padding) {
                    let seq = frame.header.record_sequence;
                    if let Some(prev) = self.last_sequence.filter(|&p| seq <= p) {
                        self.pos = next;
                        return Some(ScanItem::Corrupt {
                            offset: pos as u64,
                            error: Error::SequenceNotIncreasing {
                                offset: pos as u64,
                                previous: prev,
                                found: seq,
                            },
                            resumed_at: next as u64,
                        });
                    }
                    self.last_sequence = Some(seq);
                }
                self.pos = next;
                Some(ScanItem::Frame(frame))
            }
            Err((error, skip)) => {
                if self.mode == ScanMode::TolerateTail && all_zero(&self.bytes[pos..]) {
                    // Preallocated space never written.
                    return self.stop(StopReason::CleanEnd);
                }
                match self.resync(pos, skip) {
                    Some(frame) => {
                        let q = frame.offset;
                        self.pos = q as usize;
                        self.pending = Some(frame);
                        Some(ScanItem::Corrupt {
                            offset: pos as u64,
                            error,
                            resumed_at: q,
                        })
                    }
                    None => match self.mode {
                        ScanMode::TolerateTail => self.stop(StopReason::TornTail { error }),
                        ScanMode::Strict => self.stop(StopReason::Corrupt { error }),
                    },
                }
            }
        }
    }
}
