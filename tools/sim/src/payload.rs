//! The bytes a simulated engine computes for one page: a function of the computation identity,
//! the block's native hash (which names every token before it), the cache group and the rank —
//! the things real KV state depends on — so any instance of the same computation produces, and
//! can check, the same bytes, and a Load that delivers anything else is counted as wrong.

use sha2::{Digest, Sha256};

/// Fills `out` with the page bytes of (`identity`, `group`, `rank`, `hash`).
pub fn fill(identity: &[u8; 32], group: u32, rank: u32, hash: &[u8], out: &mut [u8]) {
    let mut h = Sha256::new();
    h.update(b"orbitkv-sim-page\0");
    h.update(identity);
    h.update(group.to_le_bytes());
    h.update(rank.to_le_bytes());
    h.update(hash);
    let seed: [u8; 32] = h.finalize().into();
    let mut state = u64::from_le_bytes([
        seed[0], seed[1], seed[2], seed[3], seed[4], seed[5], seed[6], seed[7],
    ]);
    for chunk in out.chunks_mut(8) {
        let word = splitmix64(&mut state).to_le_bytes();
        chunk.copy_from_slice(&word[..chunk.len()]);
    }
}

/// The page bytes of (`identity`, `group`, `rank`, `hash`), `len` long.
pub fn bytes(identity: &[u8; 32], group: u32, rank: u32, hash: &[u8], len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    fill(identity, group, rank, hash, &mut v);
    v
}

/// Bytes of `got` that differ from the page bytes of (`identity`, `group`, `rank`, `hash`).
pub fn wrong_bytes(identity: &[u8; 32], group: u32, rank: u32, hash: &[u8], got: &[u8]) -> u64 {
    let want = bytes(identity, group, rank, hash, got.len());
    got.iter().zip(&want).filter(|(a, b)| a != b).count() as u64
}

/// One step of SplitMix64: a fast, well-mixed deterministic stream.
pub fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_depend_on_every_input_and_nothing_else() {
        let id = [7u8; 32];
        let a = bytes(&id, 0, 0, b"h", 100);
        assert_eq!(a, bytes(&id, 0, 0, b"h", 100));
        assert_eq!(&a[..37], &bytes(&id, 0, 0, b"h", 37)[..]);
        assert_ne!(a, bytes(&[8u8; 32], 0, 0, b"h", 100));
        assert_ne!(a, bytes(&id, 1, 0, b"h", 100));
        assert_ne!(a, bytes(&id, 0, 1, b"h", 100));
        assert_ne!(a, bytes(&id, 0, 0, b"g", 100));
        assert_eq!(wrong_bytes(&id, 0, 0, b"h", &a), 0);
        let mut b = a.clone();
        b[3] ^= 1;
        b[99] ^= 0x80;
        assert_eq!(wrong_bytes(&id, 0, 0, b"h", &b), 2);
    }
}
