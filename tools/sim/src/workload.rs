//! The requests a simulated engine sends: token sequences deterministic from a seed (families of
//! documents sharing prefixes of random lengths, each request with a unique tail), or the token
//! sequences a Mooncake-format trace describes (each trace block id stands for the same tokens
//! wherever it appears, so shared ids are shared prefixes).

use crate::payload::splitmix64;

/// Token ids are drawn below this (a typical vocabulary size).
pub const VOCAB: u64 = 32_000;
/// Tokens per block of a Mooncake-format trace.
pub const TRACE_BLOCK_TOKENS: u64 = 512;

fn stream(seed: u64, salt: u64) -> u64 {
    let mut s = seed ^ salt.wrapping_mul(0xD6E8_FEB8_6659_FD93);
    splitmix64(&mut s)
}

fn tokens(state: &mut u64, n: usize) -> Vec<u64> {
    (0..n).map(|_| splitmix64(state) % VOCAB).collect()
}

/// Synthetic requests from a seed, generated on demand (a million requests cost no memory):
/// requests fall into families (one for every four requests, at least two, at most 4096); each
/// takes a prefix of its family's document (8 to 24 blocks long) cut at any token, then up to
/// four blocks of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Synthetic {
    seed: u64,
    count: u64,
    block_tokens: u64,
    families: u64,
}

impl Synthetic {
    /// `count` requests from `seed` for an engine of `block_tokens`-token blocks.
    pub fn new(seed: u64, count: u64, block_tokens: u32) -> Self {
        Self {
            seed,
            count,
            block_tokens: u64::from(block_tokens.max(1)),
            families: (count / 4).clamp(2, 4096),
        }
    }

    /// How many requests there are.
    pub fn len(&self) -> u64 {
        self.count
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    fn document(&self, family: u64) -> Vec<u64> {
        let mut s = stream(self.seed, 2 * family + 1);
        let len = (8 + splitmix64(&mut s) % 17) * self.block_tokens;
        tokens(&mut s, len as usize)
    }

    /// The tokens of request `i`.
    pub fn request(&self, i: u64) -> Vec<u64> {
        let mut s = stream(self.seed, 2 * i + 2);
        let doc = self.document(splitmix64(&mut s) % self.families);
        let keep = (doc.len() as u64 * (1 + splitmix64(&mut s) % 100) / 100) as usize;
        let tail = (splitmix64(&mut s) % (4 * self.block_tokens + 1)) as usize;
        let mut t = doc[..keep].to_vec();
        t.extend(tokens(&mut s, tail));
        t
    }
}

/// All `requests` requests of [`Synthetic::new`]`(seed, requests, block_tokens)`.
pub fn synthetic(seed: u64, requests: usize, block_tokens: u32) -> Vec<Vec<u64>> {
    let w = Synthetic::new(seed, requests as u64, block_tokens);
    (0..w.len()).map(|i| w.request(i)).collect()
}

/// The tokens of a trace request: each block id stands for [`TRACE_BLOCK_TOKENS`] tokens drawn
/// from the id alone; the sequence is cut at `input_length` when the trace gives one.
pub fn trace_tokens(hash_ids: &[u64], input_length: Option<u64>) -> Vec<u64> {
    let mut out = Vec::with_capacity(hash_ids.len() * TRACE_BLOCK_TOKENS as usize);
    for id in hash_ids {
        let mut s = stream(0x7AC3, *id);
        out.extend(tokens(&mut s, TRACE_BLOCK_TOKENS as usize));
    }
    if let Some(n) = input_length {
        out.truncate(n as usize);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn synthetic_requests_are_deterministic_and_share_prefixes() {
        let a = synthetic(5, 40, 16);
        assert_eq!(a, synthetic(5, 40, 16));
        assert_ne!(a, synthetic(6, 40, 16));
        assert_eq!(a.len(), 40);
        // Some pair shares at least one full block.
        let shared = a.iter().enumerate().any(|(i, x)| {
            a[i + 1..]
                .iter()
                .any(|y| x.len() >= 16 && y.len() >= 16 && x[..16] == y[..16])
        });
        assert!(shared);
        assert!(a.iter().all(|r| r.iter().all(|t| *t < VOCAB)));
    }

    #[test]
    fn trace_blocks_stand_for_the_same_tokens_everywhere() {
        let a = trace_tokens(&[1, 2, 3], None);
        let b = trace_tokens(&[1, 2, 9], Some(1100));
        assert_eq!(a.len(), 1536);
        assert_eq!(b.len(), 1100);
        assert_eq!(a[..1024], b[..1024]);
        assert_ne!(a[1024..1100], b[1024..]);
    }
}
