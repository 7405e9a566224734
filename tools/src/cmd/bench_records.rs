//! The records the bench commands write, shared by `bench write`/`verify` and `bench replay`:
//! their keys, their namespaces' registration and the exit code of a mismatch.

use orbitkv_state::{
    CacheGroupId, Component, HashDomain, Namespace, ParallelShape, RankSpec, StateKey,
};
use orbitkv_wal::NamespaceInfo;

use crate::Failure;

/// `bench verify` exits with this when any bundle came back with different bytes.
pub const EXIT_MISMATCH: u8 = 1;

/// The key of a self-test block: one dense-KV page of group 0, rank 0, named by `native`.
pub fn bench_state_key(namespace: Namespace, native: &[u8]) -> Result<StateKey, Failure> {
    StateKey::new(
        namespace,
        HashDomain::SglangSha256,
        native,
        CacheGroupId(0),
        Component::DenseKv,
        RankSpec::Rank(0),
    )
    .map_err(|e| Failure::internal(e.to_string()))
}

/// The namespace description the self-test commands register (no model behind it).
pub fn bench_namespace_info(model: &str, revision: String) -> NamespaceInfo {
    NamespaceInfo {
        identity: [0; 32],
        layout_digest: [0; 32],
        model: model.to_owned(),
        revision,
        engine: "bench".to_owned(),
        engine_release: env!("CARGO_PKG_VERSION").to_owned(),
        dtype: "bytes".to_owned(),
        parallel: ParallelShape::SINGLE,
    }
}
