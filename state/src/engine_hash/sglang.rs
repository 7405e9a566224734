//! SGLang's HiCache page hashes (`get_hash_str` in SGLang 0.5.23, implemented by its
//! `hash_binding.cpp`) and its storage namespace seed (`storage_namespace_seed`).
//!
//! - Per page: `SHA-256(prior ‖ tokens as u32 LE)`; when any token of the page is ≥ 2^32 the page
//!   takes the wide form `SHA-256(prior ‖ 0xff ‖ tokens as u64 LE)`. The first page has no prior
//!   unless one is given; each later page's prior is the previous page's digest. A trailing
//!   partial page is hashed like a full one. Tokens above `i64::MAX` are refused, as SGLang does.
//! - Without a page size the whole sequence is one page.
//! - `storage_namespace_seed(extra_key, cache_salt)` = `SHA-256("sglang-cache-namespace-v1" ‖ per
//!   part: 0x00 if absent, else 0x01 ‖ u64 LE byte length ‖ UTF-8)`, used as the first page's prior
//!   when either part is set and no explicit prior is given.

use sha2::{Digest, Sha256};

use crate::error::{Error, Result};

/// Domain string of the storage namespace seed.
pub const NAMESPACE_SEED_DOMAIN: &[u8] = b"sglang-cache-namespace-v1";

/// The namespace seed, or `None` when both parts are absent (un-namespaced chains stay as-is).
pub fn namespace_seed(extra_key: Option<&str>, cache_salt: Option<&str>) -> Option<[u8; 32]> {
    if extra_key.is_none() && cache_salt.is_none() {
        return None;
    }
    let mut h = Sha256::new();
    h.update(NAMESPACE_SEED_DOMAIN);
    for part in [extra_key, cache_salt] {
        match part {
            None => h.update([0u8]),
            Some(p) => {
                h.update([1u8]);
                h.update((p.len() as u64).to_le_bytes());
                h.update(p.as_bytes());
            }
        }
    }
    Some(h.finalize().into())
}

/// The prior SGLang's storage path uses: the explicit one, else the namespace seed.
pub fn storage_prior(
    prior: Option<[u8; 32]>,
    extra_key: Option<&str>,
    cache_salt: Option<&str>,
) -> Option<[u8; 32]> {
    prior.or_else(|| namespace_seed(extra_key, cache_salt))
}

fn check_tokens(tokens: &[u64], base: usize) -> Result<bool> {
    let mut wide = false;
    for (i, &t) in tokens.iter().enumerate() {
        if t > i64::MAX as u64 {
            return Err(Error::TokenOutOfRange {
                token: t,
                index: base + i,
                max: i64::MAX as u64,
            });
        }
        wide |= t > u64::from(u32::MAX);
    }
    Ok(wide)
}

fn hash_page(prior: Option<&[u8; 32]>, tokens: &[u64], wide: bool) -> [u8; 32] {
    let mut h = Sha256::new();
    if let Some(p) = prior {
        h.update(p);
    }
    if wide {
        h.update([0xffu8]);
        for &t in tokens {
            h.update(t.to_le_bytes());
        }
    } else {
        let mut buf = Vec::with_capacity(tokens.len() * 4);
        for &t in tokens {
            buf.extend_from_slice(&(t as u32).to_le_bytes());
        }
        h.update(&buf);
    }
    h.finalize().into()
}

/// One hash per page of `page_size` tokens (the last page may be partial).
pub fn page_hashes(
    tokens: &[u64],
    page_size: usize,
    prior: Option<[u8; 32]>,
) -> Result<Vec<[u8; 32]>> {
    if page_size == 0 {
        return Err(Error::ZeroSize { what: "page size" });
    }
    let mut prior = prior;
    let mut out = Vec::with_capacity(tokens.len().div_ceil(page_size));
    for (i, page) in tokens.chunks(page_size).enumerate() {
        let wide = check_tokens(page, i * page_size)?;
        let h = hash_page(prior.as_ref(), page, wide);
        prior = Some(h);
        out.push(h);
    }
    Ok(out)
}

/// One hash over the whole sequence (SGLang without a page size).
pub fn sequence_hash(tokens: &[u64], prior: Option<[u8; 32]>) -> Result<[u8; 32]> {
    let wide = check_tokens(tokens, 0)?;
    Ok(hash_page(prior.as_ref(), tokens, wide))
}

/// The signed integer SGLang publishes in KV events: the first 8 bytes, big-endian, as `i64`.
pub fn event_int64(hash: &[u8; 32]) -> i64 {
    i64::from_be_bytes([
        hash[0], hash[1], hash[2], hash[3], hash[4], hash[5], hash[6], hash[7],
    ])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hex;

    #[test]
    fn whole_sequence_vector() {
        assert_eq!(
            hex::encode(&sequence_hash(&[1, 2, 3, 4, 5], None).unwrap()),
            "4f6addc9659d6fb90fe94b6688a79f2a1fa8d36ec43f8f3e1d9b6528c448a384"
        );
    }

    #[test]
    fn refuses_zero_page_and_huge_tokens() {
        assert!(page_hashes(&[1], 0, None).is_err());
        assert!(matches!(
            page_hashes(&[1, 1 << 63], 4, None),
            Err(Error::TokenOutOfRange { index: 1, .. })
        ));
        assert!(page_hashes(&[], 4, None).unwrap().is_empty());
    }
}
