//! OrbitKV's cache manager. Landed: [`protocol`], the engine protocol (versioned, length-framed
//! messages, refused with typed errors when unknown or malformed). The daemon (sessions and
//! seal, Query / Acquire / Load / Publish / Release, the control socket, metrics) and the client
//! build on it.

pub mod protocol;
