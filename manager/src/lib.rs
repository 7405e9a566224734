//! OrbitKV's cache manager: the daemon engines talk to on each cache node.
//!
//! - [`session`]: registration and the seal (every rank agrees; epochs, tokens, timeouts).
//! - [`server`]: the Unix-socket control plane serving every request (accept and stop; one
//!   connection's read loop and writer; one handler per request; the group committer),
//!   [`peer`] its credential policy, [`metrics`] its Prometheus metrics.
//! - [`query`] (proofs from the store's index), [`lease`] (store pins under leases) and
//!   [`transfer`] (pools, Load, Publish through the GPU bridge): the hot path.
//! - The engine protocol and its Rust client are the `orbitkv-protocol` crate; the simulated
//!   engine is `orbitkv-sim`.

pub mod lease;
pub mod metrics;
pub mod peer;
pub mod query;
pub mod server;
pub mod session;
pub mod transfer;
