//! Shared test support for tests, fuzz targets, benches and the bench command.
//! [`Xorshift`] is the one deterministic random stream; [`payload`] the one payload generator.
//! The `fixtures` feature adds namespace, key and record fixtures ([`fixtures`]).
//! A failed fixture is a bug in the test: fixtures unwrap.

#![forbid(unsafe_code)]

#[cfg(feature = "fixtures")]
pub mod fixtures;

/// Xorshift64 (Marsaglia): a fast deterministic stream, never the all-zero state.
#[derive(Debug, Clone)]
pub struct Xorshift(u64);

impl Xorshift {
    /// A stream from `seed` (made odd, so never the all-zero state).
    pub fn new(seed: u64) -> Self {
        Self(seed | 1)
    }

    /// The next 64 bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A value below `n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    /// Fills `out` with the stream's bytes, eight (little-endian) per step.
    pub fn fill(&mut self, out: &mut [u8]) {
        for chunk in out.chunks_mut(8) {
            let x = self.next_u64().to_le_bytes();
            chunk.copy_from_slice(&x[..chunk.len()]);
        }
    }
}

/// `len` deterministic bytes from `seed`: the stream of [`Xorshift::new`]`(seed)`, eight bytes
/// per step.
pub fn payload(seed: u64, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    Xorshift::new(seed).fill(&mut out);
    out
}

/// A seed for item `i` of a stream seeded `seed`: distinct items get unrelated bytes.
pub fn seed_of(seed: u64, i: u64) -> u64 {
    seed ^ i.wrapping_add(1).wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_gives_the_same_bytes_and_others_differ() {
        assert_eq!(payload(7, 1000), payload(7, 1000));
        assert_ne!(payload(7, 1000), payload(8, 1000));
        assert_ne!(payload(seed_of(7, 0), 64), payload(seed_of(7, 1), 64));
        // A shorter payload is a prefix of a longer one.
        assert_eq!(payload(7, 13)[..], payload(7, 1000)[..13]);
    }

    #[test]
    fn the_stream_is_xorshift64() {
        let mut x = Xorshift::new(1);
        // 1 -> 1 ^ (1 << 13) = 0x2001; ^ (>> 7) = 0x2041; ^ (<< 17) = 0x4082_2041.
        assert_eq!(x.next_u64(), 0x4082_2041);
        assert!((0..1000).all(|_| x.below(10) < 10));
        assert_eq!(Xorshift::new(0).next_u64(), Xorshift::new(1).next_u64());
    }
}
