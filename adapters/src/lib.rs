//! OrbitKV's engine integration. This release holds identity resolution: fingerprinting model
//! artifacts by content, hub snapshots, the `ORBITKV_*` environment variables, and building the
//! computation identity from the engine's settings. The vLLM connector and the SGLang storage
//! backend follow.

pub mod error;
pub mod identity;
pub mod process;

pub use error::{Error, Result};
