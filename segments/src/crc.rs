//! CRC32C (Castagnoli), and copying bytes while computing their CRC in the same pass.

/// CRC32C of `data`.
pub fn crc32c(data: &[u8]) -> u32 {
    crc32c::crc32c(data)
}

/// Continues a CRC32C over more bytes.
pub fn crc32c_append(crc: u32, data: &[u8]) -> u32 {
    crc32c::crc32c_append(crc, data)
}

/// Bytes copied per step: small enough that the destination is still in cache when the CRC
/// reads it back.
const STEP: usize = 64 << 10;

/// Copies `src` into `dst` (same length) and returns the CRC32C of the bytes, in one pass over
/// memory. Lengths that differ copy nothing and return `None`.
pub fn copy_with_crc32c(src: &[u8], dst: &mut [u8]) -> Option<u32> {
    if src.len() != dst.len() {
        return None;
    }
    let mut crc = 0u32;
    for (s, d) in src.chunks(STEP).zip(dst.chunks_mut(STEP)) {
        d.copy_from_slice(s);
        crc = crc32c::crc32c_append(crc, d);
    }
    Some(crc)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_vector_and_fused_copy() {
        // RFC 3720 B.4: 32 bytes of zeros.
        assert_eq!(crc32c(&[0u8; 32]), 0x8a91_36aa);
        let src: Vec<u8> = (0..300_000u32).map(|i| (i * 31) as u8).collect();
        let mut dst = vec![0u8; src.len()];
        assert_eq!(copy_with_crc32c(&src, &mut dst), Some(crc32c(&src)));
        assert_eq!(dst, src);
        assert_eq!(copy_with_crc32c(&src, &mut dst[1..]), None);
        assert_eq!(crc32c_append(crc32c(&src[..10]), &src[10..]), crc32c(&src));
    }
}
