//! OrbitKV's manifest log, version 1: the durable metadata of a store — namespaces registered and
//! retired (with sequence watermarks), segment lifecycle, compaction commits, checkpoints — as
//! checksummed, sequenced records, and a pure replay. No I/O of its own; the store writes the
//! bytes and calls [`replay()`](fn@replay) on open.
//!
//! Byte tables: docs/format.md, "Manifest record".

#![forbid(unsafe_code)]

mod codec;
pub mod error;
pub mod record;
pub mod replay;

pub use error::{Error, Result};
pub use record::{
    DecodedRecord, ManifestRecord, NamespaceInfo, NamespaceState, SegmentCreated, SegmentSealed,
    SegmentState, Snapshot, decode_record, encode_record,
};
pub use replay::{ManifestState, Replay, ReplayStop, replay};
