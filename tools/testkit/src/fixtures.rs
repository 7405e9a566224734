//! Namespace, key and record fixtures shared by the store's, the daemon's and the fuzz
//! targets' tests.

#![expect(
    clippy::unwrap_used,
    reason = "fixtures built from constants: a failure is a bug in the fixture"
)]

use orbitkv_segments::RecordMeta;
use orbitkv_state::{
    CacheGroupId, Component, FormatDigest, HashDomain, Namespace, ParallelShape, RankSpec,
    StateKey, TokenRange,
};
use orbitkv_wal::NamespaceInfo;

/// The namespace fixtures use unless told another.
pub const NS: Namespace = Namespace([0x11; 32]);

/// A namespace's registration: a small model served by one rank.
pub fn info() -> NamespaceInfo {
    NamespaceInfo {
        identity: [1; 32],
        layout_digest: [2; 32],
        model: "org/tiny".into(),
        revision: "0123456789abcdef0123456789abcdef01234567".into(),
        engine: "vllm".into(),
        engine_release: "0.33.0".into(),
        dtype: "bfloat16".into(),
        parallel: ParallelShape::SINGLE,
    }
}

/// Block `i`'s key in `ns` (group 0, dense KV, rank 0).
pub fn key_in(ns: Namespace, i: u64) -> StateKey {
    let mut native = [0u8; 32];
    let h = i.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    native[..8].copy_from_slice(&h.to_le_bytes());
    native[8..16].copy_from_slice(&h.rotate_left(31).to_le_bytes());
    native[16..24].copy_from_slice(&i.to_le_bytes());
    StateKey::new(
        ns,
        HashDomain::VllmSha256Cbor,
        &native,
        CacheGroupId(0),
        Component::DenseKv,
        RankSpec::Rank(0),
    )
    .unwrap()
}

/// Block `i`'s key in [`NS`].
pub fn key(i: u64) -> StateKey {
    key_in(NS, i)
}

/// Block `i`'s record in `ns`: tokens `16i..16i+16`, its parent block `i - 1`.
pub fn meta_in(ns: Namespace, i: u64) -> RecordMeta {
    RecordMeta {
        key: key_in(ns, i),
        parent: (i > 0).then(|| key_in(ns, i - 1)),
        range: TokenRange::new(i * 16, i * 16 + 16).unwrap(),
        format: FormatDigest([3; 32]),
    }
}

/// Block `i`'s record in [`NS`].
pub fn meta(i: u64) -> RecordMeta {
    meta_in(NS, i)
}
