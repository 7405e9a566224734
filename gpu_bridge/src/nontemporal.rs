//! Copies whose destination is not read again soon: a Publish's copy-out of an engine page into
//! a buffer the store encodes later. A plain copy into memory that is not in cache first reads
//! each destination line (to own it) and then writes it back; non-temporal stores write the
//! lines straight to memory, so a copy into cold memory costs one pass instead of two. Below
//! [`MIN_LEN`] bytes (and off x86-64) the copy is a plain one.

/// Copies shorter than this are plain: a short destination is likely in cache already, and
/// the fence that ends a streaming copy is not free.
pub const MIN_LEN: usize = 16 << 10;

/// Copies `len` bytes from `src` to `dst` with non-temporal stores where that pays (see the
/// module documentation); the bytes are visible to other threads when this returns.
///
/// # Safety
/// As for [`std::ptr::copy_nonoverlapping`]: `src` is valid for `len` bytes of reads, `dst` for
/// `len` bytes of writes, and the two ranges do not overlap.
#[expect(unsafe_code, reason = "raw copies through SSE2 stream stores")]
pub unsafe fn copy(src: *const u8, dst: *mut u8, len: usize) {
    #[cfg(target_arch = "x86_64")]
    if len >= MIN_LEN {
        // SAFETY: the caller's contract is this function's.
        unsafe { stream_x86_64(src, dst, len) };
        return;
    }
    // SAFETY: the caller's contract is `copy_nonoverlapping`'s.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, len) };
}

#[cfg(target_arch = "x86_64")]
#[expect(unsafe_code, reason = "raw copies through SSE2 stream stores")]
unsafe fn stream_x86_64(src: *const u8, dst: *mut u8, len: usize) {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_sfence, _mm_stream_si128};
    // The head up to the destination's first 16-byte boundary, copied plainly.
    let head = dst.align_offset(16).min(len);
    // SAFETY: `head <= len`, so both ranges lie within the caller's.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, head) };
    let mut at = head;
    // SAFETY (every access in the loops): `at + 64` (or `at + 16`) is at most `len`, so each
    // 16-byte load and store lies within the caller's ranges; `dst + at` is 16-byte aligned
    // (`head` aligned it and every step is a multiple of 16), as `_mm_stream_si128` requires;
    // the loads are unaligned ones. SSE2 is part of the x86-64 baseline.
    unsafe {
        while at + 64 <= len {
            let s = src.add(at).cast::<__m128i>();
            let d = dst.add(at).cast::<__m128i>();
            let (a, b, c, e) = (
                _mm_loadu_si128(s),
                _mm_loadu_si128(s.add(1)),
                _mm_loadu_si128(s.add(2)),
                _mm_loadu_si128(s.add(3)),
            );
            _mm_stream_si128(d, a);
            _mm_stream_si128(d.add(1), b);
            _mm_stream_si128(d.add(2), c);
            _mm_stream_si128(d.add(3), e);
            at += 64;
        }
        while at + 16 <= len {
            _mm_stream_si128(
                dst.add(at).cast::<__m128i>(),
                _mm_loadu_si128(src.add(at).cast::<__m128i>()),
            );
            at += 16;
        }
        // The tail, plainly.
        std::ptr::copy_nonoverlapping(src.add(at), dst.add(at), len - at);
        // Stream stores are weakly ordered: fence them before anyone is told the copy is done.
        _mm_sfence();
    }
}

#[cfg(test)]
mod tests {
    #[test]
    #[expect(unsafe_code, reason = "calling the raw copy on two Vecs")]
    fn copies_every_length_and_misalignment_exactly() {
        let src: Vec<u8> = (0..(super::MIN_LEN * 3))
            .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[3])
            .collect();
        for &len in &[
            0,
            1,
            15,
            16,
            17,
            63,
            64,
            65,
            super::MIN_LEN - 1,
            super::MIN_LEN,
            super::MIN_LEN + 77,
            super::MIN_LEN * 2 + 5,
        ] {
            for src_off in [0usize, 1, 7] {
                for dst_off in [0usize, 3, 8, 15] {
                    let mut dst = vec![0xEEu8; len + dst_off + 32];
                    // SAFETY: both ranges lie in their Vecs (sized for them) and are distinct
                    // allocations.
                    unsafe {
                        super::copy(
                            src.as_ptr().add(src_off),
                            dst.as_mut_ptr().add(dst_off),
                            len,
                        )
                    };
                    assert_eq!(&dst[dst_off..dst_off + len], &src[src_off..src_off + len]);
                    assert!(dst[..dst_off].iter().all(|&b| b == 0xEE), "wrote before");
                    assert!(
                        dst[dst_off + len..].iter().all(|&b| b == 0xEE),
                        "wrote after"
                    );
                }
            }
        }
    }
}
