//! OrbitKV's bridge to engine KV pages.
//!
//! An engine rank registers page pools ([`pool::PoolSpec`]: page size and count, the cache
//! groups a page holds and their per-layer geometry). Pages are named by generation-qualified
//! references ([`pool::PageRef`]) under the session epoch. Two things are kept apart: a **store
//! pin** keeps stored bytes readable while a load is pending (the store's business), and a
//! **page lease** ([`backend::PageLease`]) is the manager's claim on an engine page while it
//! copies into or out of it — the engine cannot reallocate a leased page, and learns a copy is
//! done when the lease is gone.
//!
//! Fencing ([`fence::Bridge`]): epoch, pool, index and generation are checked before any byte
//! moves; a copy out of a page re-checks the generation afterwards and is discarded if the page
//! was reused meanwhile, so a page reused mid-copy is never stored under a valid checksum.
//!
//! Backends ([`backend::PagePool`]): the host backend ([`host`]), always built, keeps the pool
//! in shared memory owned by the engine process (a sealed memfd passed with `SCM_RIGHTS`,
//! [`fdpass`]), so tests exercise real cross-process copies. Backends whose pages are device
//! memory move them through a pinned staging buffer in batches ([`staging`]); the CUDA backend
//! (`cuda` module, feature `cuda`) is one.

pub mod backend;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod error;
pub mod fdpass;
pub mod fence;
pub mod host;
pub mod nontemporal;
pub mod pool;
pub mod staging;

pub use backend::{CopyOut, PageLease, PagePool, StagedLoad};
pub use error::{Error, Result};
pub use fence::Bridge;
pub use host::{AttachedPool, FencedStates, HostPool};
pub use pool::{GroupGeometry, PageMemory, PageRef, PoolId, PoolSpec};
