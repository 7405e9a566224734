//! The manifest codec's error type.

/// Result alias for this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Why a manifest record was refused. Offsets are from the start of the log.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Not a manifest record's magic.
    #[error("manifest record at byte {offset}: bad magic")]
    BadMagic {
        /// Where.
        offset: u64,
    },
    /// A record version this build does not read.
    #[error(
        "manifest record at byte {offset}: unsupported version {found} (this build reads {supported})"
    )]
    UnsupportedVersion {
        /// Where.
        offset: u64,
        /// Found.
        found: u32,
        /// Read by this build.
        supported: u32,
    },
    /// A header or payload CRC did not verify.
    #[error(
        "manifest record at byte {offset}: {what} checksum mismatch (expected {expected:#010x}, computed {actual:#010x})"
    )]
    ChecksumMismatch {
        /// Where.
        offset: u64,
        /// `header` or `payload`.
        what: &'static str,
        /// Stored.
        expected: u32,
        /// Computed.
        actual: u32,
    },
    /// A length beyond the format's limit or the bytes available.
    #[error("manifest record at byte {offset}: length {length} out of bounds (limit {limit})")]
    LengthOutOfBounds {
        /// Where.
        offset: u64,
        /// Found.
        length: u64,
        /// Limit.
        limit: u64,
    },
    /// The log ends inside the record.
    #[error("manifest record at byte {offset}: truncated ({needed} more bytes needed)")]
    Truncated {
        /// Where.
        offset: u64,
        /// Missing bytes.
        needed: u64,
    },
    /// A record type this version does not define.
    #[error("manifest record at byte {offset}: unknown record type {code}")]
    UnknownType {
        /// Where.
        offset: u64,
        /// The type code.
        code: u8,
    },
    /// Record sequences must increase.
    #[error("manifest record at byte {offset}: sequence {found} does not follow {previous}")]
    SequenceNotIncreasing {
        /// Where.
        offset: u64,
        /// Previous sequence.
        previous: u64,
        /// This one.
        found: u64,
    },
    /// A payload that does not parse as its type.
    #[error("manifest record at byte {offset}: malformed payload ({reason})")]
    Malformed {
        /// Where.
        offset: u64,
        /// Why.
        reason: String,
    },
    /// A text field longer than a record can hold (refused when encoding, never truncated).
    #[error("manifest field {field} is {len} bytes, longer than {limit}")]
    FieldTooLong {
        /// The field.
        field: &'static str,
        /// Its length.
        len: usize,
        /// The limit.
        limit: usize,
    },
    /// A well-formed record that contradicts the state before it (a writer bug).
    #[error("manifest record {sequence} at byte {offset}: {reason}")]
    Invalid {
        /// Where.
        offset: u64,
        /// Its sequence.
        sequence: u64,
        /// Why.
        reason: String,
    },
}
