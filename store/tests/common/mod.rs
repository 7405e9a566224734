//! Shared helpers: namespaces, keys, deterministic payloads, stores on the fault backend, and
//! the real I/O paths a machine may lack (reported `SKIPPED:`, or required: [`require`]).

#![expect(
    clippy::unwrap_used,
    reason = "test code: a failed unwrap is a failed test"
)]
#![allow(dead_code, reason = "shared by several test files; each uses a subset")]

pub mod require;

use std::path::Path;
use std::sync::Arc;

use orbitkv_store::io::Io;
use orbitkv_store::io::fault::{FaultIo, FaultPlan};
use orbitkv_store::io::uring::{self, UringIo};
use orbitkv_store::{Durability, StateStore, StoreConfig};

#[allow(
    unused_imports,
    reason = "shared by several test files; each uses a subset"
)]
pub use orbitkv_testkit::fixtures::{NS, info, key, key_in, meta, meta_in};

/// Deterministic payload of record `i` (a function of seed and index).
pub fn payload(seed: u64, i: u64, len: usize) -> Vec<u8> {
    orbitkv_testkit::payload(orbitkv_testkit::seed_of(seed, i), len)
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

/// Version `v` of record `i` (3000 bytes): the payload for seed `100 + v`.
pub fn put_version(s: &StateStore, i: u64, v: u64) {
    let p = payload(100 + v, i, 3000);
    s.put(&[(meta(i), p.as_slice())]).unwrap();
}

/// `Some(true)` exact, `Some(false)` different bytes (must never happen), `None` missing.
pub fn check(store: &StateStore, seed: u64, i: u64, len: usize) -> Option<bool> {
    let mut out = Vec::new();
    let r = store.get(&key(i), &mut out).unwrap()?;
    assert_eq!(r.range, meta(i).range);
    Some(out == payload(seed, i, len))
}

/// The `O_DIRECT` backend in `dir` (created if missing), or `None` after reporting the skip
/// (a failure where `ORBITKV_REQUIRE_DIRECT=1`).
pub fn direct_or_skip(dir: &Path) -> Option<UringIo> {
    let what = format!("O_DIRECT in {}", dir.display());
    require::or_skip(UringIo::probe(dir), require::REQUIRE_DIRECT, &what)
}

/// Whether this kernel gives an io_uring; when not, reports that `what` runs synchronously
/// (a failure where `ORBITKV_REQUIRE_URING=1`).
pub fn uring_or_skip(what: &str) -> bool {
    let ok = uring::available();
    if !ok {
        let why = "the kernel refuses a ring; the I/O ran synchronously";
        require::skipped(
            require::REQUIRE_URING,
            &format!("io_uring for {what}"),
            &why,
        );
    }
    ok
}

/// The backend the store picks for `dir` and whether it is direct, as `orbitkv serve` does;
/// reports (or fails on, where required) each of `O_DIRECT` and io_uring it goes without.
pub fn default_backend(dir: &Path) -> (Arc<dyn Io>, bool) {
    let (io, direct) = orbitkv_store::io::default_for(dir);
    if !direct {
        let why = UringIo::probe_in(dir).err().map_or_else(
            || "the store's probe refused it".to_owned(),
            |e| format!("{e}; the store ran buffered"),
        );
        let what = format!("O_DIRECT in {}", dir.display());
        require::skipped(require::REQUIRE_DIRECT, &what, &why);
    }
    uring_or_skip("the default backend");
    (io, direct)
}

/// The operation counts a crash-point test halts after, of a workload of `total` mutating
/// operations: every one of the first third, then every `stride`th.
pub fn halt_points(total: u64, stride: u64) -> Vec<u64> {
    (1..=total)
        .filter(|n| *n < total / 3 || n % stride == 0)
        .collect()
}

/// Makes `io` halt after its `n`-th mutating operation from now on.
pub fn halt_after(io: &FaultIo, n: u64) {
    io.set_plan(FaultPlan {
        halt_after_ops: Some(n),
        ..Default::default()
    });
}
