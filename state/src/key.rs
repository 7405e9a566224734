//! `StateKey { namespace, hash }`: the one key every index uses. `hash` is a versioned,
//! length-framed encoding of (engine hash domain, native chained prefix hash, cache group,
//! component, rank); the byte table is in docs/format.md ("StateKey").

use std::fmt;
use std::hash::{Hash, Hasher};

use crate::component::{CacheGroupId, Component};
use crate::error::{Error, Result};
use crate::format::RankSpec;
use crate::hex;
use crate::namespace::Namespace;

/// Current key-hash encoding version.
pub const KEY_VERSION: u8 = 1;
/// Longest native hash any domain uses.
pub const MAX_NATIVE_LEN: usize = 32;
/// Bytes of a key hash around its native hash: version, domain, length, group, component, rank.
const KEY_OVERHEAD: usize = 3 + 4 + 1 + 4;
/// Longest encoded key hash.
pub const MAX_KEY_HASH_LEN: usize = KEY_OVERHEAD + MAX_NATIVE_LEN;

/// The engine's prefix-hash scheme. Domains never compare equal, so a vLLM hash never matches an
/// SGLang hash even when the bytes are equal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum HashDomain {
    /// vLLM `sha256_cbor`: SHA-256 of canonical CBOR (32 bytes).
    VllmSha256Cbor,
    /// vLLM `xxhash_cbor`: xxh3-128 of canonical CBOR (16 bytes).
    VllmXxhashCbor,
    /// vLLM `sha256` over Python pickle (32 bytes); passed through, never recomputed here.
    VllmSha256Pickle,
    /// SGLang page hash chain (32 bytes).
    SglangSha256,
}

impl HashDomain {
    /// All domains.
    pub const ALL: [HashDomain; 4] = [
        HashDomain::VllmSha256Cbor,
        HashDomain::VllmXxhashCbor,
        HashDomain::VllmSha256Pickle,
        HashDomain::SglangSha256,
    ];
    /// One-byte code.
    pub const fn code(self) -> u8 {
        match self {
            HashDomain::VllmSha256Cbor => 1,
            HashDomain::VllmXxhashCbor => 2,
            HashDomain::VllmSha256Pickle => 3,
            HashDomain::SglangSha256 => 4,
        }
    }
    /// Decodes a domain code.
    pub fn from_code(code: u8) -> Result<Self> {
        HashDomain::ALL
            .into_iter()
            .find(|d| d.code() == code)
            .ok_or(Error::UnknownCode {
                what: "hash domain",
                code: u32::from(code),
            })
    }
    /// Length of this domain's native hash.
    pub const fn native_len(self) -> usize {
        match self {
            HashDomain::VllmXxhashCbor => 16,
            _ => 32,
        }
    }
    /// Name as `engine/algorithm`.
    pub const fn name(self) -> &'static str {
        match self {
            HashDomain::VllmSha256Cbor => "vllm/sha256_cbor",
            HashDomain::VllmXxhashCbor => "vllm/xxhash_cbor",
            HashDomain::VllmSha256Pickle => "vllm/sha256",
            HashDomain::SglangSha256 => "sglang/sha256",
        }
    }
    /// Parses an `engine/algorithm` name.
    pub fn from_name(name: &str) -> Result<Self> {
        HashDomain::ALL
            .into_iter()
            .find(|d| d.name() == name)
            .ok_or_else(|| Error::InvalidField {
                field: "hash domain",
                reason: format!("unknown domain {name:?}"),
            })
    }
}

impl fmt::Display for HashDomain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The encoded `hash` half of a [`StateKey`], held inline (no allocation). Always valid: built
/// only by [`KeyHash::new`] or [`KeyHash::decode`].
#[derive(Clone, Copy)]
pub struct KeyHash {
    len: u8,
    buf: [u8; MAX_KEY_HASH_LEN],
}

impl KeyHash {
    /// Encodes a key hash; the native hash must have its domain's length.
    pub fn new(
        domain: HashDomain,
        native: &[u8],
        group: CacheGroupId,
        component: Component,
        rank: RankSpec,
    ) -> Result<Self> {
        let n = domain.native_len();
        if native.len() != n {
            return Err(Error::InvalidLength {
                what: "native prefix hash",
                expected: n,
                actual: native.len(),
            });
        }
        let mut buf = [0u8; MAX_KEY_HASH_LEN];
        buf[0] = KEY_VERSION;
        buf[1] = domain.code();
        buf[2] = n as u8;
        buf[3..3 + n].copy_from_slice(native);
        buf[3 + n..7 + n].copy_from_slice(&group.0.to_le_bytes());
        buf[7 + n] = component.code();
        buf[8 + n..12 + n].copy_from_slice(&rank.code().to_le_bytes());
        Ok(Self {
            len: (KEY_OVERHEAD + n) as u8,
            buf,
        })
    }

    /// Decodes exactly one key hash occupying all of `bytes`.
    pub fn decode(bytes: &[u8]) -> Result<Self> {
        let (hash, used) = Self::decode_prefix(bytes)?;
        if used != bytes.len() {
            return Err(Error::TrailingBytes {
                what: "key hash",
                extra: bytes.len() - used,
            });
        }
        Ok(hash)
    }

    /// Decodes a key hash at the start of `bytes`, returning it and the bytes it used.
    pub fn decode_prefix(bytes: &[u8]) -> Result<(Self, usize)> {
        let truncated = |needed: usize| Error::Truncated {
            what: "key hash",
            offset: bytes.len(),
            needed,
        };
        if bytes.len() < 3 {
            return Err(truncated(3 - bytes.len()));
        }
        if bytes[0] != KEY_VERSION {
            return Err(Error::UnsupportedVersion {
                what: "key hash",
                version: u32::from(bytes[0]),
            });
        }
        let domain = HashDomain::from_code(bytes[1])?;
        let n = usize::from(bytes[2]);
        if n != domain.native_len() {
            return Err(Error::InvalidLength {
                what: "native prefix hash",
                expected: domain.native_len(),
                actual: n,
            });
        }
        let total = KEY_OVERHEAD + n;
        if bytes.len() < total {
            return Err(truncated(total - bytes.len()));
        }
        Component::from_code(bytes[7 + n])?;
        let mut buf = [0u8; MAX_KEY_HASH_LEN];
        buf[..total].copy_from_slice(&bytes[..total]);
        Ok((
            Self {
                len: total as u8,
                buf,
            },
            total,
        ))
    }

    /// The encoded bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.buf[..usize::from(self.len)]
    }
    fn n(&self) -> usize {
        usize::from(self.buf[2])
    }
    /// The engine hash domain.
    pub fn domain(&self) -> HashDomain {
        // Valid by construction; VllmSha256Cbor is unreachable as a fallback.
        HashDomain::from_code(self.buf[1]).unwrap_or(HashDomain::VllmSha256Cbor)
    }
    /// The engine's native chained prefix hash.
    pub fn native(&self) -> &[u8] {
        &self.buf[3..3 + self.n()]
    }
    /// The cache group.
    pub fn group(&self) -> CacheGroupId {
        let n = self.n();
        CacheGroupId(u32::from_le_bytes([
            self.buf[3 + n],
            self.buf[4 + n],
            self.buf[5 + n],
            self.buf[6 + n],
        ]))
    }
    /// The component.
    pub fn component(&self) -> Component {
        Component::from_code(self.buf[7 + self.n()]).unwrap_or(Component::Auxiliary)
    }
    /// The rank.
    pub fn rank(&self) -> RankSpec {
        let n = self.n();
        RankSpec::from_code(u32::from_le_bytes([
            self.buf[8 + n],
            self.buf[9 + n],
            self.buf[10 + n],
            self.buf[11 + n],
        ]))
    }
}

impl PartialEq for KeyHash {
    fn eq(&self, other: &Self) -> bool {
        self.as_bytes() == other.as_bytes()
    }
}
impl Eq for KeyHash {}
impl Hash for KeyHash {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.as_bytes().hash(state);
    }
}
impl PartialOrd for KeyHash {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for KeyHash {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.as_bytes().cmp(other.as_bytes())
    }
}
impl fmt::Debug for KeyHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "KeyHash({} {} group {} {} {})",
            self.domain(),
            hex::encode(self.native()),
            self.group(),
            self.component(),
            self.rank()
        )
    }
}

/// The index key of one record: the instance's namespace and the key hash. Query and Publish derive
/// it the same way, from the registered instance and the engine's native hash.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StateKey {
    /// The instance's storage identity.
    pub namespace: Namespace,
    /// The record's hash within it.
    pub hash: KeyHash,
}

impl StateKey {
    /// Builds a key.
    pub fn new(
        namespace: Namespace,
        domain: HashDomain,
        native: &[u8],
        group: CacheGroupId,
        component: Component,
        rank: RankSpec,
    ) -> Result<Self> {
        Ok(Self {
            namespace,
            hash: KeyHash::new(domain, native, group, component, rank)?,
        })
    }
    /// `namespace (32 bytes) ‖ key hash`.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(32 + usize::from(self.hash.len));
        out.extend_from_slice(&self.namespace.0);
        out.extend_from_slice(self.hash.as_bytes());
        out
    }
    /// Decodes exactly one key occupying all of `bytes`.
    pub fn decode(bytes: &[u8]) -> Result<Self> {
        if bytes.len() < 32 {
            return Err(Error::Truncated {
                what: "state key",
                offset: bytes.len(),
                needed: 32 - bytes.len(),
            });
        }
        let mut ns = [0u8; 32];
        ns.copy_from_slice(&bytes[..32]);
        Ok(Self {
            namespace: Namespace(ns),
            hash: KeyHash::decode(&bytes[32..])?,
        })
    }
}

impl fmt::Display for StateKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}/{}",
            self.namespace,
            hex::encode(self.hash.as_bytes())
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn domain_names_round_trip_and_unknown_refused() {
        for d in HashDomain::ALL {
            assert_eq!(HashDomain::from_name(d.name()).unwrap(), d);
        }
        assert!(HashDomain::from_name("vllm/md5").is_err());
    }

    fn key(domain: HashDomain, native: &[u8], component: Component) -> StateKey {
        StateKey::new(
            Namespace([9; 32]),
            domain,
            native,
            CacheGroupId(0),
            component,
            RankSpec::Rank(0),
        )
        .unwrap()
    }

    #[test]
    fn domains_and_components_never_collide() {
        let h = [5u8; 32];
        assert_ne!(
            key(HashDomain::VllmSha256Cbor, &h, Component::DenseKv),
            key(HashDomain::SglangSha256, &h, Component::DenseKv)
        );
        assert_ne!(
            key(HashDomain::SglangSha256, &h, Component::SsmState),
            key(HashDomain::SglangSha256, &h, Component::ConvState)
        );
    }

    #[test]
    fn round_trip_and_fields() {
        let k = StateKey::new(
            Namespace([1; 32]),
            HashDomain::VllmXxhashCbor,
            &[3; 16],
            CacheGroupId(7),
            Component::Mla,
            RankSpec::Replicated,
        )
        .unwrap();
        let bytes = k.encode();
        assert_eq!(bytes.len(), 32 + 12 + 16);
        let d = StateKey::decode(&bytes).unwrap();
        assert_eq!(d, k);
        assert_eq!(d.hash.group(), CacheGroupId(7));
        assert_eq!(d.hash.component(), Component::Mla);
        assert_eq!(d.hash.rank(), RankSpec::Replicated);
        assert_eq!(d.hash.native(), &[3; 16]);
        assert_eq!(d.hash.domain(), HashDomain::VllmXxhashCbor);
    }

    #[test]
    fn wrong_native_length_refused() {
        assert!(matches!(
            KeyHash::new(
                HashDomain::VllmXxhashCbor,
                &[0; 32],
                CacheGroupId(0),
                Component::DenseKv,
                RankSpec::Rank(0)
            ),
            Err(Error::InvalidLength { .. })
        ));
    }
}
