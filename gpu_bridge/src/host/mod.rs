//! The host backend: an engine's page pool in shared memory the engine process owns.
//! The engine creates the pool ([`HostPool::create`]: a sealed memfd).
//! It passes the descriptor over the control socket ([`crate::fdpass`]).
//! The manager maps it ([`AttachedPool::attach`]) after checking it against the registration.
//! Both sides fence pages with the per-page state words ([`FencedStates`]), as the CUDA backend.
//! The region's layout is in `docs/protocol.md` ("Host page pool").
//!
//! The files split by role, and the `unsafe` with them:
//! `layout` computes the region's layout (no `unsafe`);
//! `region` maps it and holds every raw access to its bytes;
//! `engine_pool` creates the sealed memfd;
//! `engine_memory` reaches pages in memory the engine allocated itself (mapped, or by
//! `pread`/`pwrite` when it may shrink);
//! `attached_pool` and `fenced_states` hold no `unsafe`.

mod attached_pool;
mod engine_memory;
mod engine_pool;
mod fenced_states;
mod layout;
mod region;
#[cfg(test)]
mod tests;

pub use attached_pool::AttachedPool;
pub use engine_memory::kept_descriptors;
pub use engine_pool::{HostPool, engine_memory};
pub use fenced_states::FencedStates;
pub use layout::{DATA_ALIGN, HEADER_LEN, REGION_MAGIC, REGION_VERSION};
