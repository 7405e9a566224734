//! OrbitKV's cache manager: the daemon engines talk to on each cache node.
//!
//! - [`protocol`]: the engine protocol (versioned, length-framed messages; unknown or malformed
//!   ones refused with typed errors).
//! - [`session`]: registration and the seal (every rank agrees; epochs, tokens, timeouts).
//! - [`server`]: the Unix-socket control plane serving every request (accept and stop; one
//!   connection's read loop and writer; one handler per request; the group committer),
//!   [`peer`] its credential policy, [`metrics`] its Prometheus metrics.
//! - [`query`] (proofs from the store's index), [`lease`] (store pins under leases) and
//!   [`transfer`] (pools, Load, Publish through the GPU bridge): the hot path.
//! - [`client`]: the Rust client; [`sim`]: a simulated engine (instances, payloads, workloads,
//!   the engine driving the daemon).

pub mod client;
pub mod lease;
pub mod metrics;
pub mod peer;
pub mod protocol;
pub mod query;
pub mod server;
pub mod session;
pub mod sim;
pub mod transfer;
