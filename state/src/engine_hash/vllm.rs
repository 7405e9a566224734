//! vLLM's prefix-cache block hashes (`sha256_cbor`, `xxhash_cbor`), as vLLM 0.33 computes them in
//! `vllm/v1/core/kv_cache_utils.py`:
//!
//! - `H(x)` = SHA-256 or xxh3-128 (big-endian digest) of `x` serialized as canonical CBOR;
//! - `NONE_HASH = H(seed)` with `seed` = `PYTHONHASHSEED` when set, else `"vllm-none-hash"` for
//!   `sha256_cbor`; `xxhash_cbor` without a seed is refused (vLLM would seed it randomly);
//! - block hash = `H([parent or NONE_HASH, [token ids], extra keys or null])`, full blocks only;
//! - extra keys, in vLLM's order: `("lora", name, path)` on every block, `("mm", identifier,
//!   offset − block start)` for each multimodal item overlapping the block, `("cache_salt", salt)`
//!   on the block starting at token 0 when the salt is non-empty, `("prompt_embeds", digest)`.
//!
//! The pickle-based `sha256` algorithm is not reimplemented: such hashes are passed through from
//! the engine in the `vllm/sha256` domain.

use sha2::Digest;

use super::cbor;
use crate::error::{Error, Result};
use crate::key::HashDomain;

/// vLLM's default NONE_HASH seed for cryptographic algorithms.
pub const DEFAULT_NONE_HASH_SEED: &str = "vllm-none-hash";

/// The CBOR-based algorithms this crate computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum VllmHashAlgo {
    /// `sha256_cbor` (32-byte hashes).
    Sha256Cbor,
    /// `xxhash_cbor`: xxh3-128, canonical big-endian digest (16-byte hashes).
    XxhashCbor,
}

impl VllmHashAlgo {
    /// vLLM's name for the algorithm.
    pub const fn name(self) -> &'static str {
        match self {
            VllmHashAlgo::Sha256Cbor => "sha256_cbor",
            VllmHashAlgo::XxhashCbor => "xxhash_cbor",
        }
    }
    /// Parses vLLM's name.
    pub fn from_name(name: &str) -> Result<Self> {
        match name {
            "sha256_cbor" => Ok(VllmHashAlgo::Sha256Cbor),
            "xxhash_cbor" => Ok(VllmHashAlgo::XxhashCbor),
            other => Err(Error::InvalidField {
                field: "algo",
                reason: format!(
                    "unsupported vLLM hash algorithm {other:?} (sha256_cbor or xxhash_cbor; pickle-based `sha256` hashes are passed through, not recomputed)"
                ),
            }),
        }
    }
    /// The StateKey domain of hashes made with this algorithm.
    pub const fn domain(self) -> HashDomain {
        match self {
            VllmHashAlgo::Sha256Cbor => HashDomain::VllmSha256Cbor,
            VllmHashAlgo::XxhashCbor => HashDomain::VllmXxhashCbor,
        }
    }
    /// Hashes already-serialized bytes.
    pub fn digest(self, bytes: &[u8]) -> Vec<u8> {
        match self {
            VllmHashAlgo::Sha256Cbor => sha2::Sha256::digest(bytes).to_vec(),
            VllmHashAlgo::XxhashCbor => xxhash_rust::xxh3::xxh3_128(bytes).to_be_bytes().to_vec(),
        }
    }
}

/// One extra key of a block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExtraKey {
    /// `("lora", name, path)`.
    Lora {
        /// LoRA adapter name.
        name: String,
        /// LoRA adapter path.
        path: String,
    },
    /// `("mm", identifier, offset)`; `offset` is relative to the block start (may be negative).
    Mm {
        /// The item's identifier (vLLM's mm hash).
        identifier: String,
        /// Item offset minus block start.
        offset: i64,
    },
    /// `("cache_salt", salt)`.
    CacheSalt(String),
    /// `("prompt_embeds", digest)`: SHA-256 over the block's prompt-embedding tensor bytes.
    PromptEmbeds(Vec<u8>),
}

/// A multimodal placeholder in absolute token positions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MmItem {
    /// The item's identifier.
    pub identifier: String,
    /// First placeholder token.
    pub offset: u64,
    /// Number of placeholder tokens.
    pub length: u64,
}

/// What of a request enters its block hashes besides tokens.
#[derive(Debug, Clone, Default)]
pub struct RequestExtras {
    /// Active LoRA adapter `(name, path)`.
    pub lora: Option<(String, String)>,
    /// `cache_salt`; an empty salt counts as none, as in vLLM.
    pub cache_salt: Option<String>,
    /// Multimodal items sorted by offset, not overlapping.
    pub mm: Vec<MmItem>,
    /// Per full block, the prompt-embeds digest vLLM computed, when the request has prompt embeds.
    pub prompt_embeds: Option<Vec<Vec<u8>>>,
}

/// Serializes `(parent, tokens, extra keys)` as vLLM's canonical CBOR; empty extras become null.
pub fn serialize_block(parent: &[u8], tokens: &[u64], extra: &[ExtraKey]) -> Vec<u8> {
    let mut out = Vec::with_capacity(parent.len() + tokens.len() * 3 + 16);
    cbor::array(&mut out, 3);
    cbor::bytes(&mut out, parent);
    cbor::array(&mut out, tokens.len());
    for &t in tokens {
        cbor::uint(&mut out, t);
    }
    if extra.is_empty() {
        cbor::null(&mut out);
    } else {
        cbor::array(&mut out, extra.len());
        for key in extra {
            match key {
                ExtraKey::Lora { name, path } => {
                    cbor::array(&mut out, 3);
                    cbor::text(&mut out, "lora");
                    cbor::text(&mut out, name);
                    cbor::text(&mut out, path);
                }
                ExtraKey::Mm { identifier, offset } => {
                    cbor::array(&mut out, 3);
                    cbor::text(&mut out, "mm");
                    cbor::text(&mut out, identifier);
                    cbor::int(&mut out, *offset);
                }
                ExtraKey::CacheSalt(salt) => {
                    cbor::array(&mut out, 2);
                    cbor::text(&mut out, "cache_salt");
                    cbor::text(&mut out, salt);
                }
                ExtraKey::PromptEmbeds(digest) => {
                    cbor::array(&mut out, 2);
                    cbor::text(&mut out, "prompt_embeds");
                    cbor::bytes(&mut out, digest);
                }
            }
        }
    }
    out
}

/// Computes vLLM block hashes for one algorithm, seed and block size.
#[derive(Debug, Clone)]
pub struct VllmHasher {
    algo: VllmHashAlgo,
    block_size: usize,
    none_hash: Vec<u8>,
}

impl VllmHasher {
    /// `seed` is the `PYTHONHASHSEED` the engine runs with (`None` when unset).
    pub fn new(algo: VllmHashAlgo, block_size: usize, seed: Option<&str>) -> Result<Self> {
        if block_size == 0 {
            return Err(Error::ZeroSize { what: "block size" });
        }
        Ok(Self {
            algo,
            block_size,
            none_hash: none_hash(algo, seed)?,
        })
    }
    /// The NONE_HASH used as the first block's parent.
    pub fn none_hash(&self) -> &[u8] {
        &self.none_hash
    }
    /// The algorithm.
    pub fn algo(&self) -> VllmHashAlgo {
        self.algo
    }

    /// Hashes one block; an empty `parent` means the first block (NONE_HASH), as in vLLM.
    pub fn hash_block(&self, parent: &[u8], tokens: &[u64], extra: &[ExtraKey]) -> Vec<u8> {
        let parent = if parent.is_empty() {
            &self.none_hash
        } else {
            parent
        };
        self.algo.digest(&serialize_block(parent, tokens, extra))
    }

    /// The extra keys vLLM attaches to the block `[start, end)` (absolute token positions);
    /// `block_index` selects the prompt-embeds digest.
    pub fn extra_keys(
        &self,
        extras: &RequestExtras,
        start: u64,
        end: u64,
        block_index: usize,
    ) -> Result<Vec<ExtraKey>> {
        let mut keys = Vec::new();
        if let Some((name, path)) = &extras.lora {
            keys.push(ExtraKey::Lora {
                name: name.clone(),
                path: path.clone(),
            });
        }
        for (index, item) in extras.mm.iter().enumerate() {
            if item.offset < end && item.offset.saturating_add(item.length) > start {
                let offset = i128::from(item.offset) - i128::from(start);
                let offset = i64::try_from(offset).map_err(|_| Error::InvalidMultimodal {
                    index,
                    reason: "offset out of range",
                })?;
                keys.push(ExtraKey::Mm {
                    identifier: item.identifier.clone(),
                    offset,
                });
            }
        }
        if start == 0
            && let Some(salt) = extras.cache_salt.as_ref().filter(|s| !s.is_empty())
        {
            keys.push(ExtraKey::CacheSalt(salt.clone()));
        }
        if let Some(digests) = &extras.prompt_embeds {
            let digest = digests.get(block_index).ok_or(Error::InvalidField {
                field: "prompt_embeds",
                reason: format!("no digest for block {block_index}"),
            })?;
            keys.push(ExtraKey::PromptEmbeds(digest.clone()));
        }
        Ok(keys)
    }

    /// Hashes every full block of `tokens`, whose first token sits at absolute position
    /// `start_token`; `parent` continues an existing chain (`None` starts one). A trailing
    /// partial block gets no hash, as in vLLM.
    pub fn block_hashes(
        &self,
        tokens: &[u64],
        start_token: u64,
        parent: Option<&[u8]>,
        extras: &RequestExtras,
    ) -> Result<Vec<Vec<u8>>> {
        check_mm(&extras.mm)?;
        if extras
            .lora
            .as_ref()
            .is_some_and(|(_, path)| path.is_empty())
        {
            // vLLM asserts a LoRA request has a path.
            return Err(Error::InvalidField {
                field: "lora path",
                reason: "must not be empty".to_owned(),
            });
        }
        let mut parent = parent.map(<[u8]>::to_vec).unwrap_or_default();
        let mut out = Vec::with_capacity(tokens.len() / self.block_size);
        for (i, block) in tokens.chunks_exact(self.block_size).enumerate() {
            let overflow = || Error::InvalidField {
                field: "start_token",
                reason: "token positions overflow 64 bits".to_owned(),
            };
            let start = (i as u64)
                .checked_mul(self.block_size as u64)
                .and_then(|o| start_token.checked_add(o))
                .ok_or_else(overflow)?;
            let end = start
                .checked_add(self.block_size as u64)
                .ok_or_else(overflow)?;
            let extra = self.extra_keys(extras, start, end, i)?;
            let h = self.hash_block(&parent, block, &extra);
            parent.clone_from(&h);
            out.push(h);
        }
        Ok(out)
    }
}

/// `NONE_HASH` for `algo` and the engine's `PYTHONHASHSEED` (`None` when unset).
pub fn none_hash(algo: VllmHashAlgo, seed: Option<&str>) -> Result<Vec<u8>> {
    let seed = match (seed, algo) {
        (Some(s), _) => s,
        (None, VllmHashAlgo::Sha256Cbor) => DEFAULT_NONE_HASH_SEED,
        (None, VllmHashAlgo::XxhashCbor) => {
            return Err(Error::MissingSeed {
                algo: "xxhash_cbor",
            });
        }
    };
    let mut enc = Vec::with_capacity(seed.len() + 9);
    cbor::text(&mut enc, seed);
    Ok(algo.digest(&enc))
}

/// The integer vLLM publishes in KV events for a block hash: its last 8 bytes, big-endian.
pub fn event_int(hash: &[u8]) -> u64 {
    let tail = &hash[hash.len().saturating_sub(8)..];
    tail.iter().fold(0u64, |acc, &b| (acc << 8) | u64::from(b))
}

fn check_mm(items: &[MmItem]) -> Result<()> {
    for (i, w) in items.windows(2).enumerate() {
        if w[1].offset < w[0].offset.saturating_add(w[0].length) {
            return Err(Error::InvalidMultimodal {
                index: i + 1,
                reason: "items must be sorted by offset and must not overlap",
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hex;

    #[test]
    fn default_none_hash_matches_vllm() {
        let h = none_hash(VllmHashAlgo::Sha256Cbor, None).unwrap();
        assert_eq!(
            hex::encode(&h),
            "9bd96a485ad84efdafb72ee48a1d7a69bcead0f8f0433173941b276b9581eef0"
        );
        assert_eq!(
            none_hash(VllmHashAlgo::XxhashCbor, None),
            Err(Error::MissingSeed {
                algo: "xxhash_cbor"
            })
        );
    }

    #[test]
    fn salt_only_on_first_block_and_empty_salt_ignored() {
        let h = VllmHasher::new(VllmHashAlgo::Sha256Cbor, 2, None).unwrap();
        let extras = RequestExtras {
            cache_salt: Some("s".into()),
            ..Default::default()
        };
        assert_eq!(h.extra_keys(&extras, 0, 2, 0).unwrap().len(), 1);
        assert!(h.extra_keys(&extras, 2, 4, 1).unwrap().is_empty());
        let empty = RequestExtras {
            cache_salt: Some(String::new()),
            ..Default::default()
        };
        assert!(h.extra_keys(&empty, 0, 2, 0).unwrap().is_empty());
    }

    #[test]
    fn huge_start_token_is_refused_not_wrapped() {
        let h = VllmHasher::new(VllmHashAlgo::Sha256Cbor, 2, None).unwrap();
        let extras = RequestExtras {
            cache_salt: Some("s".into()),
            ..Default::default()
        };
        assert!(
            h.block_hashes(&[1, 2, 3, 4], u64::MAX - 2, None, &extras)
                .is_err()
        );
    }

    #[test]
    fn overlapping_mm_items_refused() {
        let h = VllmHasher::new(VllmHashAlgo::Sha256Cbor, 2, None).unwrap();
        let item = |offset, length| MmItem {
            identifier: "x".into(),
            offset,
            length,
        };
        let extras = RequestExtras {
            mm: vec![item(0, 4), item(3, 2)],
            ..Default::default()
        };
        assert!(h.block_hashes(&[1, 2, 3, 4], 0, None, &extras).is_err());
    }
}
