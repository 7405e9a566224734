//! Shared helpers: registrations of a simulated instance, a store in a temporary directory.

#![allow(dead_code, reason = "shared by several test files; each uses a subset")]

use std::path::Path;
use std::sync::Arc;

use orbitkv_manager::protocol::Role;
use orbitkv_manager::protocol::message::Register;
use orbitkv_manager::sim::SimInstance;
use orbitkv_store::{StateStore, StoreConfig};

/// The registration of `role`/`rank` in instance `instance` of `workers` ranks.
pub fn registration(instance: &str, role: Role, rank: u32, workers: u32) -> Register {
    let mut sim = SimInstance::new(instance, workers);
    sim.seal_timeout_ms = 1000;
    sim.registration(role, rank)
        .unwrap_or_else(|e| panic!("{e}"))
}

/// A store in `dir` (portable backend, manual durability).
pub fn store(dir: &Path) -> Arc<StateStore> {
    let mut c = StoreConfig::new(dir);
    c.durability = orbitkv_store::Durability::Manual;
    let io: Arc<dyn orbitkv_store::io::Io> = Arc::new(orbitkv_store::io::std_io::StdIo);
    Arc::new(StateStore::open(io, c).unwrap_or_else(|e| panic!("{e}")))
}
