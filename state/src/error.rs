//! The crate's error type: every refusal names what was wrong, so callers can report it and fail closed.

use crate::component::{CacheGroupId, Component};

/// Result alias for this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything the state vocabulary can refuse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Text that should be hexadecimal is not.
    #[error("{what}: invalid hex ({reason})")]
    InvalidHex {
        /// The input being decoded.
        what: &'static str,
        /// Why it was refused.
        reason: &'static str,
    },
    /// A fixed-size value has the wrong length.
    #[error("{what}: expected {expected} bytes, got {actual}")]
    InvalidLength {
        /// The value being decoded.
        what: &'static str,
        /// Required length.
        expected: usize,
        /// Length found.
        actual: usize,
    },
    /// An encoding ends before a field it announces.
    #[error("{what}: truncated at byte {offset} ({needed} more bytes needed)")]
    Truncated {
        /// The structure being decoded.
        what: &'static str,
        /// Where the missing bytes start.
        offset: usize,
        /// How many bytes were missing.
        needed: usize,
    },
    /// An encoding has bytes after its last field.
    #[error("{what}: {extra} trailing bytes")]
    TrailingBytes {
        /// The structure being decoded.
        what: &'static str,
        /// How many bytes were left over.
        extra: usize,
    },
    /// An encoding carries a version this build does not know.
    #[error("{what}: unsupported version {version}")]
    UnsupportedVersion {
        /// The structure being decoded.
        what: &'static str,
        /// The version found.
        version: u32,
    },
    /// A tag or code has no meaning in this version.
    #[error("{what}: unknown code {code}")]
    UnknownCode {
        /// The field holding the code.
        what: &'static str,
        /// The code found.
        code: u32,
    },
    /// Required fields of a builder were never set; all of them are named.
    #[error("missing required field(s): {}", fields.join(", "))]
    MissingFields {
        /// The missing fields' names, in canonical order.
        fields: Vec<&'static str>,
    },
    /// A field is present but unusable.
    #[error("invalid `{field}`: {reason}")]
    InvalidField {
        /// The field's name.
        field: &'static str,
        /// Why it was refused.
        reason: String,
    },
    /// JSON input is malformed or outside the canonical subset (RFC 8785).
    #[error("invalid JSON at byte {offset}: {reason}")]
    InvalidJson {
        /// Byte offset of the problem.
        offset: usize,
        /// Why it was refused.
        reason: &'static str,
    },
    /// A token range that is empty or reversed.
    #[error("invalid token range [{start}, {end}): start must be below end")]
    InvalidTokenRange {
        /// Start token.
        start: u64,
        /// End token.
        end: u64,
    },
    /// A storage layout or state format that is internally inconsistent.
    #[error("invalid layout: {reason}")]
    InvalidLayout {
        /// Why it was refused.
        reason: String,
    },
    /// A recovery contract that cannot be compiled.
    #[error("invalid recovery contract for group {group}: {reason}")]
    InvalidContract {
        /// The group whose rule was refused.
        group: CacheGroupId,
        /// Why it was refused.
        reason: String,
    },
    /// A rule was declared for a component it cannot describe.
    #[error("group {group}: rule {rule} does not apply to component {component}")]
    RuleMismatch {
        /// The group.
        group: CacheGroupId,
        /// The rule's name.
        rule: &'static str,
        /// The group's component.
        component: Component,
    },
    /// An engine hash was asked for without the seed the engine would need.
    #[error(
        "{algo} needs an explicit seed (PYTHONHASHSEED); without one the engine seeds randomly and its hashes cannot be reproduced"
    )]
    MissingSeed {
        /// The hash algorithm.
        algo: &'static str,
    },
    /// A token id outside what the engine's hash accepts.
    #[error("token id {token} at position {index} is out of range (maximum {max})")]
    TokenOutOfRange {
        /// The token id.
        token: u64,
        /// Its position in the input.
        index: usize,
        /// The largest accepted id.
        max: u64,
    },
    /// Block or page size zero.
    #[error("{what} must be positive")]
    ZeroSize {
        /// Which size.
        what: &'static str,
    },
    /// Multimodal placeholders that are unsorted or overlap.
    #[error("multimodal item {index}: {reason}")]
    InvalidMultimodal {
        /// The item's position in the list.
        index: usize,
        /// Why it was refused.
        reason: &'static str,
    },
    /// An active LoRA adapter: unsupported until its identity can be named.
    #[error(
        "active LoRA adapters are unsupported: the cache cannot name the adapted computation yet (start without LoRA)"
    )]
    UnsupportedLora,
}
