//! The store's error type. Every variant says what to do about it where an operator can act.

use std::path::PathBuf;
use std::time::Duration;

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
    /// The store does not take this write now; reads are still served. [`Error::retry`] says
    /// whether and when to try again.
    #[error("the store refuses writes: {0}")]
    WritesRefused(WriteRefusal),
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
    /// Records accepted since the last sync were lost to a failed write or fsync before they
    /// were durable; they must be put again.
    #[error(
        "{records} records accepted since the last sync were lost to a failed write or fsync; put them again"
    )]
    Lost {
        /// How many.
        records: u64,
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

/// Why the store refuses writes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WriteRefusal {
    /// The store was opened read-only.
    #[error("the store was opened read-only")]
    ReadOnly,
    /// The data directory's device reported no space; puts are tried again after `retry_after`.
    #[error(
        "no space left on the data directory's device; try again in {} ms (or free space)",
        retry_after.as_millis()
    )]
    NoSpace {
        /// How long until a put is tried again.
        retry_after: Duration,
    },
    /// A manifest checkpoint could not be made durable: a record appended now could vanish with
    /// its rename, so nothing is appended until the store is opened again.
    #[error(
        "the manifest checkpoint could not be made durable ({detail}); restart the daemon once the disk is healthy"
    )]
    CheckpointFailed {
        /// The failure.
        detail: String,
    },
    /// A manifest append failed and its record could not be taken back out of the file: the
    /// record may take effect at the next open, so nothing more is appended until then.
    #[error(
        "a failed manifest append could not be rolled back ({detail}); restart the daemon once the disk is healthy"
    )]
    ManifestUncertain {
        /// The failure.
        detail: String,
    },
    /// A record or manifest sequence on disk is at [`crate::SEQUENCE_LIMIT`] or above: no store
    /// reaches it, so a damaged or crafted record claims it, and later sequences could not be
    /// kept increasing.
    #[error(
        "a record on disk claims sequence {highest}, past any the store writes (damage or a crafted file); the store serves reads only"
    )]
    SequencesExhausted {
        /// The highest sequence found.
        highest: u64,
    },
    /// A segment active at the last shutdown could not be sealed on open (a full disk).
    #[error(
        "segment {segment}, active at the last shutdown, could not be sealed ({detail}); free space and restart the daemon"
    )]
    RecoveryUnsealed {
        /// The segment.
        segment: u64,
        /// The failure.
        detail: String,
    },
    /// Every segment id has been used (ids are never reused).
    #[error("segment ids are exhausted; start a new data directory")]
    SegmentIdsExhausted,
    /// A failed write sealed the active segment off while this put waited; the next put starts
    /// a new one.
    #[error("the active segment was sealed off by a failed write; try again")]
    SealedOff,
}

/// Whether a refused or failed request may succeed if sent again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retry {
    /// Send it again after this long: the condition is transient (no space, a full SSD tier,
    /// a failed write that sealed a segment off).
    After(Duration),
    /// This store takes no writes until an operator acts (read-only, a failed checkpoint,
    /// ids exhausted, damage): stop sending them.
    Never,
    /// This request can never succeed as it is; others may (a record that conflicts with a
    /// stored one, an unknown namespace, a bundle too large).
    Rejected,
}

impl WriteRefusal {
    /// Whether a write refused for this reason may succeed later.
    pub fn retry(&self) -> Retry {
        match self {
            WriteRefusal::NoSpace { retry_after } => Retry::After(*retry_after),
            WriteRefusal::SealedOff => Retry::After(Duration::ZERO),
            WriteRefusal::ReadOnly
            | WriteRefusal::CheckpointFailed { .. }
            | WriteRefusal::ManifestUncertain { .. }
            | WriteRefusal::RecoveryUnsealed { .. }
            | WriteRefusal::SegmentIdsExhausted
            | WriteRefusal::SequencesExhausted { .. } => Retry::Never,
        }
    }
}

impl Error {
    /// Whether the request that failed with this error may succeed if sent again, and when.
    /// An I/O error is transient (the failing segment is sealed off; the next write starts a
    /// new one) and retried after [`crate::NO_SPACE_RETRY`] so a failing disk is not hammered.
    pub fn retry(&self) -> Retry {
        match self {
            Error::WritesRefused(r) => r.retry(),
            Error::Lost { .. } => Retry::After(Duration::ZERO),
            Error::Io { .. } | Error::CapacityExhausted { .. } => {
                Retry::After(crate::NO_SPACE_RETRY)
            }
            Error::Index(orbitkv_index::Error::TooManyClasses { .. }) => Retry::Never,
            Error::UnknownNamespace(_)
            | Error::BadBundle(_)
            | Error::Format(_)
            | Error::Index(_) => Retry::Rejected,
            Error::Locked { .. }
            | Error::IncompatibleStore { .. }
            | Error::Damaged { .. }
            | Error::BadConfig(_)
            | Error::Manifest(_) => Retry::Never,
        }
    }
}

/// Attaches a path and operation to an I/O error.
pub(crate) fn io_err(
    path: &std::path::Path,
    op: &'static str,
) -> impl FnOnce(std::io::Error) -> Error {
    let path = path.to_owned();
    move |source| Error::Io { path, op, source }
}
