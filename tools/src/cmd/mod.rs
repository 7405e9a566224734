//! One module per command.

pub mod admin;
pub mod bench;
pub mod bench_records;
pub mod crashtest;
pub mod engine_sim;
pub mod hash;
pub mod identity;
pub mod loadgen;
pub mod matrix;
mod policy_model;
pub mod replay;
pub mod serve;
pub mod store;
pub mod tracegen;
