//! OrbitKV's cache manager. Landed: [`protocol`], the engine protocol (versioned, length-framed
//! messages, refused with typed errors when unknown or malformed), and [`session`], registration
//! and the seal (agreement of every rank, epochs, tokens, timeouts). The daemon (Query / Acquire
//! / Load / Publish / Release, the control socket, metrics) and the client build on them.

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
