//! One module per command.

pub mod hash;
pub mod identity;
