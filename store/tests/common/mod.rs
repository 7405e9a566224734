//! Shared helpers: namespaces, keys, deterministic payloads, stores on the fault backend.

#![expect(
    clippy::unwrap_used,
    reason = "test code: a failed unwrap is a failed test"
)]
#![allow(dead_code, reason = "shared by several test files; each uses a subset")]

use std::sync::Arc;

use orbitkv_segments::RecordMeta;
use orbitkv_state::{
    CacheGroupId, Component, FormatDigest, HashDomain, Namespace, ParallelShape, RankSpec,
    StateKey, TokenRange,
};
use orbitkv_store::io::Io;
use orbitkv_store::io::fault::FaultIo;
use orbitkv_store::{Durability, StateStore, StoreConfig};
use orbitkv_wal::NamespaceInfo;

pub const NS: Namespace = Namespace([0x11; 32]);

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

pub fn key(i: u64) -> StateKey {
    key_in(NS, i)
}

pub fn meta_in(ns: Namespace, i: u64) -> RecordMeta {
    RecordMeta {
        key: key_in(ns, i),
        parent: (i > 0).then(|| key_in(ns, i - 1)),
        range: TokenRange::new(i * 16, i * 16 + 16).unwrap(),
        format: FormatDigest([3; 32]),
    }
}

pub fn meta(i: u64) -> RecordMeta {
    meta_in(NS, i)
}

/// Deterministic payload of record `i` (a function of seed and index).
pub fn payload(seed: u64, i: u64, len: usize) -> Vec<u8> {
    let mut x = (seed ^ i.wrapping_mul(0x2545_f491_4f6c_dd1d)) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

pub fn config(segment_bytes: u64, durability: Durability) -> StoreConfig {
    let mut c = StoreConfig::new("data");
    c.segment_bytes = segment_bytes;
    c.durability = durability;
    c
}

pub fn open(io: &FaultIo, segment_bytes: u64, durability: Durability) -> StateStore {
    open_with(io, config(segment_bytes, durability))
}

/// Opens `config` on `io` and registers [`NS`].
pub fn open_with(io: &FaultIo, config: StoreConfig) -> StateStore {
    let io: Arc<dyn Io> = Arc::new(io.clone());
    let store = StateStore::open(io, config).unwrap();
    store.register_namespace(NS, info()).unwrap();
    store
}

/// Puts records `from..to` one bundle each.
pub fn put_range(store: &StateStore, seed: u64, from: u64, to: u64, len: usize) {
    for i in from..to {
        let p = payload(seed, i, len);
        store.put(&[(meta(i), p.as_slice())]).unwrap();
    }
}

/// `Some(true)` exact, `Some(false)` different bytes (must never happen), `None` missing.
pub fn check(store: &StateStore, seed: u64, i: u64, len: usize) -> Option<bool> {
    let mut out = Vec::new();
    let r = store.get(&key(i), &mut out).unwrap()?;
    assert_eq!(r.range, meta(i).range);
    Some(out == payload(seed, i, len))
}
