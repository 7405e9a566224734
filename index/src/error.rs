//! The index's error type.

use orbitkv_state::{FormatDigest, Namespace};

/// Result alias for this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What the index refuses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A location outside what an entry can hold (segment offsets are stored in 8-byte units).
    #[error("{what} {value} does not fit an index entry (limit {limit})")]
    OutOfRange {
        /// The field.
        what: &'static str,
        /// Its value.
        value: u64,
        /// The largest accepted.
        limit: u64,
    },
    /// A record whose format differs from the one already indexed for its namespace, group,
    /// component and rank (the namespace fixes every rank's format, so this is a caller bug).
    #[error(
        "namespace {namespace}: format {found} differs from the indexed {indexed} for the same group and rank"
    )]
    FormatConflict {
        /// The namespace.
        namespace: Namespace,
        /// The format already indexed.
        indexed: FormatDigest,
        /// The format offered.
        found: FormatDigest,
    },
    /// More distinct (namespace, group, component, rank) classes than an entry can name.
    #[error("more than {limit} key classes")]
    TooManyClasses {
        /// The limit.
        limit: u32,
    },
}
