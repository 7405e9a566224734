//! OrbitKV's state vocabulary: what a cached record *is*.
//!
//! - [`ComputationIdentity`] names the model computation (artifacts by content, config, engine,
//!   dtypes, backend, cache variant); [`StorageLayout`] names the instance's registered geometry;
//!   together with an optional [`CacheScope`] they derive the [`Namespace`].
//! - [`StateKey`] `{ namespace, hash }` is the one key every index uses; the hash frames the
//!   engine's native chained prefix hash with group, component and rank.
//! - [`StateFormat`] describes a record's bytes; its digest decides byte compatibility.
//! - [`RecoveryContract`] and [`validate`] decide the largest boundary that is provably restorable.
//! - [`engine_hash`] reproduces vLLM's and SGLang's own prefix hashes bit for bit.
//!
//! Pure: no I/O, no unsafe code. Byte layouts are in docs/format.md.

#![forbid(unsafe_code)]

mod codec;
pub mod component;
pub mod contract;
pub mod engine_hash;
pub mod error;
pub mod format;
pub mod hex;
pub mod identity;
pub mod jcs;
pub mod key;
pub mod label;
pub mod layout;
pub mod namespace;
pub mod range;
pub mod validator;

pub use component::{CacheGroupId, Component};
pub use contract::{GroupContract, Ranks, RecoveryContract, Rule};
pub use error::{Error, Result};
pub use format::{
    Axis, Dim, FormatDigest, HeadShape, ImplTag, ParallelShape, RankSpec, StateFormat,
};
pub use identity::{ComputationIdentity, EngineKind, IdentityBuilder, IdentityField, ModelDigest};
pub use key::{HashDomain, KeyHash, StateKey};
pub use label::Label;
pub use layout::{CacheGroupSpec, StorageLayout};
pub use namespace::{CacheScope, Namespace};
pub use range::TokenRange;
pub use validator::{
    Disagreement, Exclusion, GroupLoad, Outcome, Proof, Recompute, RecordEvidence, RestoreRequest,
    Validation, validate,
};
