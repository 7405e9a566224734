//! `Namespace`: the complete storage identity of an instance — computation identity, storage
//! layout and cache scope. Two engines share state only when their namespaces are equal.

use std::fmt;

use crate::codec::Writer;
use crate::error::{Error, Result};
use crate::format::domain_digest;
use crate::hex;
use crate::identity::ComputationIdentity;
use crate::layout::StorageLayout;

/// Current namespace derivation version.
pub const NAMESPACE_VERSION: u32 = 1;
/// Domain tag of the namespace digest.
pub const NAMESPACE_DOMAIN: &str = "orbitkv.namespace";
/// Longest cache scope accepted.
pub const MAX_SCOPE_LEN: usize = 64;

/// `ORBITKV_CACHE_SCOPE`: an optional tenant or experiment scope, 1 to 64 bytes of
/// `[A-Za-z0-9._-]`. It separates deployments; it never stands in for the model fingerprint.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CacheScope(String);

impl CacheScope {
    /// Validates a scope.
    pub fn new(value: &str) -> Result<Self> {
        let ok = !value.is_empty()
            && value.len() <= MAX_SCOPE_LEN
            && value
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
        if ok {
            Ok(Self(value.to_owned()))
        } else {
            Err(Error::InvalidField {
                field: "ORBITKV_CACHE_SCOPE",
                reason: format!(
                    "must be 1..={MAX_SCOPE_LEN} characters of [A-Za-z0-9._-] (got {value:?})"
                ),
            })
        }
    }
    /// The scope text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// SHA-256 naming an instance's storage; part of every [`crate::StateKey`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Namespace(pub [u8; 32]);

impl Namespace {
    /// Derives the namespace every rank and the scheduler of an instance agree on.
    pub fn derive(
        identity: &ComputationIdentity,
        layout: &StorageLayout,
        scope: Option<&CacheScope>,
    ) -> Self {
        let mut w = Writer::with_capacity(128);
        w.u32(NAMESPACE_VERSION)
            .raw(identity.digest())
            .raw(&layout.digest());
        match scope {
            None => {
                w.u8(0);
            }
            Some(s) => {
                w.u8(1).bytes16(s.as_str().as_bytes());
            }
        }
        Namespace(domain_digest(NAMESPACE_DOMAIN, &w.into_bytes()))
    }
}

impl fmt::Display for Namespace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex::encode(&self.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::tests::two_rank_layout;

    #[test]
    fn scope_and_identity_separate_namespaces() {
        let layout = two_rank_layout();
        let id = ComputationIdentity::from_digest([1; 32]);
        let a = Namespace::derive(&id, &layout, None);
        let b = Namespace::derive(&id, &layout, Some(&CacheScope::new("tenant-a").unwrap()));
        let c = Namespace::derive(&ComputationIdentity::from_digest([2; 32]), &layout, None);
        assert_ne!(a, b);
        assert_ne!(a, c);
        assert_eq!(a, Namespace::derive(&id, &two_rank_layout(), None));
        assert!(CacheScope::new("").is_err());
        assert!(CacheScope::new("a b").is_err());
        assert!(CacheScope::new(&"a".repeat(65)).is_err());
    }
}
