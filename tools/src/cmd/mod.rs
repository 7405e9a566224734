//! One module per command.

pub mod admin;
pub mod bench;
pub mod hash;
pub mod identity;
pub mod replay;
pub mod serve;
pub mod store;
