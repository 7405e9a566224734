//! The store's error type. Every variant says what to do about it where an operator can act.

use std::path::PathBuf;

use orbitkv_state::Namespace;

/// Result alias for this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What the store refuses or fails at.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An I/O call failed.
    #[error("{}: {op}: {source}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// What was attempted.
        op: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// Another process holds the data directory.
    #[error(
        "{}: the data directory is in use by another process (a running `orbitkv serve`, or an offline fsck/compact/retire); stop it first",
        path.display()
    )]
    Locked {
        /// The data directory.
        path: PathBuf,
    },
    /// The store was written by a format this build does not read.
    #[error(
        "{}: store format version {found}, this build reads {supported}; there is no upgrade path before 1.0: run `orbitkv fsck --data-dir {} --discard-incompatible` to start it empty",
        path.display(),
        path.display()
    )]
    IncompatibleStore {
        /// The data directory.
        path: PathBuf,
        /// The version found.
        found: u32,
        /// The version this build reads.
        supported: u32,
    },
    /// Files that a store needs are missing or damaged beyond recovery on open.
    #[error("{}: {reason}; run `orbitkv fsck --data-dir {}`", path.display(), path.display())]
    Damaged {
        /// The data directory.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A put of a namespace that was never registered.
    #[error("namespace {0} is not registered")]
    UnknownNamespace(Namespace),
    /// The store stopped accepting puts (no space, or a failed fsync sealed the segment off);
    /// reads are still served.
    #[error("the store refuses writes: {reason}")]
    WritesRefused {
        /// Why.
        reason: String,
    },
    /// The SSD tier is full and every segment that could be reclaimed is pinned or still being
    /// written; the put may be retried once pins are released.
    #[error(
        "the SSD tier is full ({used} of {budget} bytes, {need} more needed) and nothing can be reclaimed: release pins or raise the SSD budget"
    )]
    CapacityExhausted {
        /// Bytes the put needs.
        need: u64,
        /// Bytes the segments use.
        used: u64,
        /// The SSD budget.
        budget: u64,
    },
    /// A configuration the store cannot run with.
    #[error("bad store configuration: {0}")]
    BadConfig(String),
    /// A bundle the format cannot carry (too large, bad ranges).
    #[error("bundle refused: {0}")]
    BadBundle(String),
    /// A format-layer error.
    #[error(transparent)]
    Format(#[from] orbitkv_segments::Error),
    /// A manifest-layer error.
    #[error(transparent)]
    Manifest(#[from] orbitkv_wal::Error),
    /// An index error.
    #[error(transparent)]
    Index(#[from] orbitkv_index::Error),
}

/// Attaches a path and operation to an I/O error.
pub(crate) fn io_err(
    path: &std::path::Path,
    op: &'static str,
) -> impl FnOnce(std::io::Error) -> Error {
    let path = path.to_owned();
    move |source| Error::Io { path, op, source }
}
