//! The segment format's error type: what was wrong, where, and the values that disagreed.

/// Result alias for this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Which checksum failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Checksum {
    /// A fixed-size header's CRC (directory, segment, frame, trailer).
    Header,
    /// A frame's payload CRC.
    Payload,
    /// The footer block's CRC.
    Footer,
    /// The footer's SHA-256 recorded in the trailer.
    FooterDigest,
}

/// Everything the format layer refuses. Offsets are from the start of the buffer decoded (for
/// segments: the start of the segment file).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Not the structure's magic number.
    #[error("{what} at byte {offset}: bad magic")]
    BadMagic {
        /// The structure.
        what: &'static str,
        /// Where.
        offset: u64,
    },
    /// A version this build does not read (there is no compatibility path before 1.0).
    #[error(
        "{what} at byte {offset}: unsupported format version {found} (this build reads {supported})"
    )]
    UnsupportedVersion {
        /// The structure.
        what: &'static str,
        /// Where.
        offset: u64,
        /// The version found.
        found: u32,
        /// The version this build reads.
        supported: u32,
    },
    /// A checksum did not verify.
    #[error(
        "{what} at byte {offset}: {kind:?} checksum mismatch (expected {expected:#010x}, computed {actual:#010x})"
    )]
    ChecksumMismatch {
        /// The structure.
        what: &'static str,
        /// Which checksum.
        kind: Checksum,
        /// Where.
        offset: u64,
        /// The stored value.
        expected: u32,
        /// The computed value.
        actual: u32,
    },
    /// A frame of another segment instance (left by an earlier use of the file, or spliced in).
    #[error("frame at byte {offset}: segment sequence {found}, this segment is {expected}")]
    StaleSequence {
        /// Where.
        offset: u64,
        /// The segment's sequence.
        expected: u64,
        /// The frame's.
        found: u64,
    },
    /// A record sequence that does not increase (a duplicated or reordered frame).
    #[error("frame at byte {offset}: record sequence {found} does not follow {previous}")]
    SequenceNotIncreasing {
        /// Where.
        offset: u64,
        /// The previous frame's record sequence.
        previous: u64,
        /// This frame's.
        found: u64,
    },
    /// A length that does not fit what holds it, or exceeds a format limit.
    #[error("{what} at byte {offset}: length {length} out of bounds (limit {limit})")]
    LengthOutOfBounds {
        /// The structure.
        what: &'static str,
        /// Where.
        offset: u64,
        /// The length found.
        length: u64,
        /// The largest acceptable here.
        limit: u64,
    },
    /// The bytes end before the structure does.
    #[error("{what} at byte {offset}: truncated ({needed} more bytes needed)")]
    Truncated {
        /// The structure.
        what: &'static str,
        /// Where the structure starts.
        offset: u64,
        /// Missing bytes.
        needed: u64,
    },
    /// A field whose value is not allowed (checksums verified: this is a writer bug or an attack).
    #[error("{what} at byte {offset}: invalid {field}: {reason}")]
    InvalidField {
        /// The structure.
        what: &'static str,
        /// Where.
        offset: u64,
        /// The field.
        field: &'static str,
        /// Why.
        reason: String,
    },
    /// A compressed payload that does not decompress to its recorded length.
    #[error("frame at byte {offset}: payload does not decompress ({reason})")]
    Decompress {
        /// Where.
        offset: u64,
        /// What zstd or the length check said.
        reason: String,
    },
    /// The caller's buffer or arguments do not fit the operation.
    #[error("{0}")]
    Usage(String),
}
