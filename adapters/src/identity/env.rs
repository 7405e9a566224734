//! The environment variables both adapters honour.
//!
//! - `ORBITKV_MODEL_FINGERPRINT`: exactly 64 lowercase hex digits. When set, artifact files are not
//!   read; the digest stands for weights, tokenizer, processor and model code (the operator owns
//!   its accuracy). The model config still participates in the identity.
//! - `ORBITKV_CACHE_SCOPE`: optional tenant/experiment scope (1..=64 of `[A-Za-z0-9._-]`); it enters
//!   the namespace, not the computation identity, and never replaces the fingerprint.
//!
//! A variable that is set but unusable (empty, malformed, not UTF-8) is an error naming it.

use std::ffi::OsString;

use orbitkv_state::{CacheScope, ModelDigest};

use crate::error::{Error, Result};

/// Name of the operator fingerprint variable.
pub const MODEL_FINGERPRINT_VAR: &str = "ORBITKV_MODEL_FINGERPRINT";
/// Name of the cache scope variable.
pub const CACHE_SCOPE_VAR: &str = "ORBITKV_CACHE_SCOPE";

/// The parsed variables.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IdentityEnv {
    /// The operator digest, when `ORBITKV_MODEL_FINGERPRINT` is set.
    pub operator_digest: Option<ModelDigest>,
    /// The scope, when `ORBITKV_CACHE_SCOPE` is set.
    pub scope: Option<CacheScope>,
}

impl IdentityEnv {
    /// Reads the variables of this process.
    pub fn from_process() -> Result<Self> {
        Self::parse(
            std::env::var_os(MODEL_FINGERPRINT_VAR),
            std::env::var_os(CACHE_SCOPE_VAR),
        )
    }

    /// Parses given raw values (`None` = unset).
    pub fn parse(fingerprint: Option<OsString>, scope: Option<OsString>) -> Result<Self> {
        let text = |var: &'static str, v: OsString| {
            v.into_string().map_err(|_| Error::Env {
                var,
                reason: "not valid UTF-8".to_owned(),
            })
        };
        let operator_digest = match fingerprint {
            None => None,
            Some(v) => {
                let v = text(MODEL_FINGERPRINT_VAR, v)?;
                Some(ModelDigest::operator_from_hex(&v).map_err(|_| {
                    let n = v.chars().count();
                    let found = if n == 64 {
                        "64 characters, not all lowercase hex".to_owned()
                    } else {
                        format!("{n} characters")
                    };
                    Error::Env {
                        var: MODEL_FINGERPRINT_VAR,
                        reason: format!("must be exactly 64 lowercase hex digits (got {found})"),
                    }
                })?)
            }
        };
        let scope = match scope {
            None => None,
            Some(v) => {
                let v = text(CACHE_SCOPE_VAR, v)?;
                Some(CacheScope::new(&v).map_err(|_| Error::Env {
                    var: CACHE_SCOPE_VAR,
                    reason: format!(
                        "must be 1..={} characters of [A-Za-z0-9._-] (got {v:?})",
                        orbitkv_state::namespace::MAX_SCOPE_LEN
                    ),
                })?)
            }
        };
        Ok(Self {
            operator_digest,
            scope,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(s: &str) -> Option<OsString> {
        Some(OsString::from(s))
    }

    #[test]
    fn fingerprint_must_be_64_lowercase_hex() {
        let ok = IdentityEnv::parse(os(&"ab".repeat(32)), None).unwrap();
        assert!(matches!(ok.operator_digest, Some(ModelDigest::Operator(_))));
        for bad in ["", "AB", &"AB".repeat(32), &"a".repeat(63), &"g".repeat(64)] {
            let err = IdentityEnv::parse(os(bad), None).unwrap_err();
            assert!(err.to_string().starts_with(MODEL_FINGERPRINT_VAR), "{err}");
        }
        assert_eq!(
            IdentityEnv::parse(None, None).unwrap(),
            IdentityEnv::default()
        );
    }

    #[test]
    fn scope_is_validated() {
        assert!(
            IdentityEnv::parse(None, os("tenant-a.exp_1"))
                .unwrap()
                .scope
                .is_some()
        );
        for bad in ["", "has space", "ünï", &"x".repeat(65)] {
            let err = IdentityEnv::parse(None, os(bad)).unwrap_err();
            assert!(err.to_string().starts_with(CACHE_SCOPE_VAR), "{err}");
        }
    }

    #[test]
    fn non_utf8_refused() {
        use std::os::unix::ffi::OsStringExt;
        let bad = OsString::from_vec(vec![0xff, 0xfe]);
        assert!(IdentityEnv::parse(Some(bad.clone()), None).is_err());
        assert!(IdentityEnv::parse(None, Some(bad)).is_err());
    }
}
