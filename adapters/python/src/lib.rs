//! `orbitkv._native`: what must agree bit for bit with the daemon, computed by the daemon's own
//! Rust code — identity resolution, state formats and storage layouts, pool geometry, host page
//! pools, the engines' native hashes — and the session client over the engine protocol. The
//! pure-Python package `orbitkv` re-exports it.

mod errors;
mod fd_unsafe;
mod identity;
mod inbox;
mod layout;
mod pool;
mod replies;
mod session;

use pyo3::prelude::*;

/// The native module.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("PROTOCOL_VERSION", orbitkv_protocol::VERSION)?;
    m.add("SOCKET_VAR", orbitkv_protocol::discover::SOCKET_VAR)?;
    m.add("MAX_NAME", orbitkv_protocol::message::MAX_NAME)?;
    // Most block hashes one Query or Acquire may name, over all its groups.
    m.add(
        "MAX_QUERY_BLOCKS",
        orbitkv_protocol::message::MAX_QUERY_BLOCKS,
    )?;
    // The rank of a page every rank shares (MLA's), in Publish, Load and Proof.
    m.add("RANK_REPLICATED", orbitkv_state::format::RANK_REPLICATED)?;
    errors::add(m)?;
    m.add_function(wrap_pyfunction!(identity::resolve_identity, m)?)?;
    m.add_function(wrap_pyfunction!(identity::vllm_block_hashes, m)?)?;
    m.add_function(wrap_pyfunction!(identity::sglang_page_hashes, m)?)?;
    m.add_function(wrap_pyfunction!(identity::sglang_namespace_seed, m)?)?;
    m.add_function(wrap_pyfunction!(session::socket_candidates, m)?)?;
    m.add_class::<identity::Identity>()?;
    m.add_class::<layout::StateFormat>()?;
    m.add_class::<layout::CacheGroup>()?;
    m.add_class::<layout::StorageLayout>()?;
    m.add_class::<layout::GroupGeometry>()?;
    m.add_class::<layout::PoolSpec>()?;
    m.add_class::<pool::HostPool>()?;
    m.add_class::<session::Connection>()?;
    m.add_class::<replies::Sealed>()?;
    m.add_class::<replies::PoolRegistered>()?;
    m.add_class::<replies::Proof>()?;
    m.add_class::<replies::ProofLoad>()?;
    m.add_class::<replies::Miss>()?;
    m.add_class::<replies::Leased>()?;
    m.add_class::<replies::Pages>()?;
    m.add_class::<replies::Done>()?;
    Ok(())
}
