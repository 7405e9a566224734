//! OrbitKV's on-disk segment format, version 1: pure encoders, decoders and a scanner with no I/O
//! of their own, which no byte pattern can make panic, allocate without bound, or return data whose
//! checksums did not verify.
//!
//! - [`DataDirHeader`]: a store's format version, recognised before anything else is read.
//! - [`SegmentHeader`]: the first 4 KiB of a segment; its sequence (epoch) is in every frame.
//! - Frames ([`frame`]): record, tombstone or padding; 256-byte header with its own CRC, then
//!   the payload with its CRC; packed (8-byte) or direct-I/O (4 KiB) alignment per segment;
//!   optional zstd payloads.
//! - [`Footer`] and [`Trailer`]: a sealed segment's index, read from the tail alone.
//! - [`Scanner`]: frames of a segment region, and why it stopped (clean end, torn tail, or the
//!   typed corruption), resynchronising past corrupt records.
//! - [`SegmentBuilder`]: assembles a segment image in memory (tests, fixtures, tools).
//!
//! Byte tables: docs/format.md.

#![forbid(unsafe_code)]

pub mod builder;
pub mod crc;
pub mod dir_header;
pub mod error;
mod fixed;
pub mod footer;
pub mod frame;
mod le;
pub mod scanner;
pub mod segment_header;

pub use builder::SegmentBuilder;
pub use dir_header::{DIR_HEADER_FILE, DIR_HEADER_LEN, DataDirHeader, STORE_FORMAT_VERSION};
pub use error::{Checksum, Error, Result};
pub use footer::{Footer, IndexEntry, NamespaceSummary, TRAILER_LEN, Trailer};
pub use frame::{
    Compression, FRAME_HEADER_LEN, FrameBody, FrameHeader, FrameKind, MAX_PAYLOAD_LEN, RecordMeta,
};
pub use scanner::{FrameRef, ScanEnd, ScanItem, ScanMode, Scanner, StopReason};
pub use segment_header::{Alignment, SEGMENT_HEADER_LEN, SegmentHeader};
