//! A simulated engine, for a machine without a GPU and without an engine: what an instance is
//! ([`instance`]), the bytes its computation produces ([`payload`]), the requests it sends
//! ([`workload`]) and the engine itself talking to the daemon ([`engine`]). `orbitkv
//! engine-sim`, `orbitkv loadgen`, the tests and the benchmarks drive the daemon with it.
//!
//! It speaks only the public protocol crate, never the daemon's library: what it does, any
//! engine can do.

#![forbid(unsafe_code)]

pub mod engine;
pub mod instance;
pub mod payload;
pub mod workload;

pub use engine::{
    Acked, AckedPage, Checked, CheckedPage, EngineOptions, Observer, Pages, PublishObserver,
    Report, RequestOutcome, SimEngine, SimError,
};
pub use instance::{SimContract, SimGroup, SimInstance, SimPlacement};
