//! The bridge's errors: every refusal names what was wrong, so the manager can report it to the
//! engine as a typed error (and the engine recompute exactly that page).

use std::io;

use crate::pool::PoolId;

/// Why a page operation was refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The request names a session epoch other than the one the pool was registered under.
    #[error("stale epoch: the pool is registered under epoch {current}, the request names {got}")]
    StaleEpoch {
        /// The pool's epoch.
        current: u64,
        /// The request's.
        got: u64,
    },
    /// No pool of that id is registered.
    #[error("unknown pool {pool}")]
    UnknownPool {
        /// The pool named.
        pool: PoolId,
    },
    /// The page index is not in the pool.
    #[error("page {index} is out of range for pool {pool} ({pages} pages)")]
    IndexOutOfRange {
        /// The pool.
        pool: PoolId,
        /// The index named.
        index: u32,
        /// Pages in the pool.
        pages: u32,
    },
    /// The page was reallocated since the reference was taken.
    #[error(
        "stale page: pool {pool} page {index} is at generation {current}, the request names {got}"
    )]
    StaleGeneration {
        /// The pool.
        pool: PoolId,
        /// The page.
        index: u32,
        /// The page's generation now.
        current: u64,
        /// The reference's.
        got: u64,
    },
    /// The page changed generation while its bytes were copied out: the copy is discarded.
    #[error(
        "pool {pool} page {index} was reused during the copy (generation {before} -> {after}); copy discarded"
    )]
    ChangedDuringCopy {
        /// The pool.
        pool: PoolId,
        /// The page.
        index: u32,
        /// Generation before the copy.
        before: u64,
        /// Generation after it.
        after: u64,
    },
    /// The engine tried to reallocate a page the manager holds a lease on.
    #[error("pool {pool} page {index} is leased ({leases} outstanding); it cannot be reused yet")]
    PageLeased {
        /// The pool.
        pool: PoolId,
        /// The page.
        index: u32,
        /// Leases outstanding.
        leases: u32,
    },
    /// A page already carries the most leases its state word can count.
    #[error("pool {pool} page {index} has too many leases")]
    TooManyLeases {
        /// The pool.
        pool: PoolId,
        /// The page.
        index: u32,
    },
    /// The pool was detached (its engine disconnected): no copy touches it any more.
    #[error("pool {pool} is detached")]
    Detached {
        /// The pool.
        pool: PoolId,
    },
    /// A pool's geometry is inconsistent (a layer reaches past the page, a size is zero, ...).
    #[error("bad pool geometry: {0}")]
    Geometry(String),
    /// A shared pool region does not match what was registered or is not a pool at all.
    #[error("bad pool region: {0}")]
    Region(String),
    /// A copy's bytes do not fit the pages or layers it names.
    #[error("copy of {got} bytes does not match the {expected} bytes of the layers named")]
    Length {
        /// Bytes the layers hold.
        expected: u64,
        /// Bytes given.
        got: u64,
    },
    /// A device driver call failed, or the device is unusable (the CUDA backend).
    #[error("device: {call}: {detail}")]
    Device {
        /// The driver call or step.
        call: &'static str,
        /// What it returned.
        detail: String,
    },
    /// An operating-system call failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The error.
        #[source]
        source: io::Error,
    },
}

/// The bridge's result.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// An [`Error::Io`] for `what` from the last OS error.
pub(crate) fn os_err(what: &'static str) -> Error {
    Error::Io {
        what,
        source: io::Error::last_os_error(),
    }
}
