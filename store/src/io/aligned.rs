//! Buffers for direct I/O: `O_DIRECT` requests need their buffer address, file offset and
//! length on [`DIRECT_ALIGN`] boundaries. Safe code: a vector is over-allocated and the bytes
//! start after a pad, so nothing here needs a custom allocator.

/// Alignment of buffer addresses, offsets and lengths for direct I/O.
pub const DIRECT_ALIGN: usize = 4096;

/// Whether a request of `len` bytes at `ptr` and file `offset` can go direct.
pub(crate) fn is_aligned(ptr: *const u8, len: usize, offset: u64) -> bool {
    len > 0
        && (ptr as usize).is_multiple_of(DIRECT_ALIGN)
        && len.is_multiple_of(DIRECT_ALIGN)
        && offset.is_multiple_of(DIRECT_ALIGN as u64)
}

/// An empty-looking buffer for up to `capacity` bytes appended after `pad` zero bytes, where
/// `pad` puts the appended bytes on a [`DIRECT_ALIGN`] boundary; returns it with `pad`. The
/// vector is over-allocated, so appending up to `capacity` bytes never moves it (if it does
/// move, requests through it are merely not direct).
pub fn aligned_vec(capacity: usize) -> (Vec<u8>, usize) {
    let mut v = Vec::with_capacity(capacity + DIRECT_ALIGN);
    let pad = (DIRECT_ALIGN - (v.as_ptr() as usize) % DIRECT_ALIGN) % DIRECT_ALIGN;
    v.resize(pad, 0);
    (v, pad)
}

/// As [`aligned_vec`], for a buffer the device reads whole (a direct write of several
/// frames): its bytes start on a huge-page boundary, and its whole huge pages are advised for
/// transparent huge pages. A write from 4 KiB pages scattered in physical memory reaches a
/// virtual disk in hundreds of small segments, and ran about a third slower on the disk measured
/// (docs/performance.md).
/// The pad costs up to one huge page of memory.
pub fn write_vec(capacity: usize) -> (Vec<u8>, usize) {
    use super::madvise::{HUGE_PAGE, advise_huge_pages};
    let mut v = Vec::with_capacity(capacity + HUGE_PAGE);
    let pad = (HUGE_PAGE - (v.as_ptr() as usize) % HUGE_PAGE) % HUGE_PAGE;
    v.resize(pad, 0);
    advise_huge_pages(v.spare_capacity_mut());
    (v, pad)
}

/// A zeroed buffer whose slice `[pad..pad + len]` starts on a [`DIRECT_ALIGN`] boundary;
/// returns it with `pad`.
pub fn aligned_buffer(len: usize) -> (Vec<u8>, usize) {
    let (mut v, pad) = aligned_vec(len);
    v.resize(pad + len, 0);
    (v, pad)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_buffers_start_on_a_huge_page_and_never_move() {
        let (mut v, pad) = write_vec(4 << 20);
        let at = v.as_ptr() as usize + pad;
        assert!(at.is_multiple_of(super::super::madvise::HUGE_PAGE));
        assert_eq!(v.len(), pad);
        v.resize(pad + (4 << 20), 7);
        assert_eq!(v.as_ptr() as usize + pad, at);
    }

    #[test]
    fn aligned_buffers_are_aligned_and_zeroed() {
        for len in [4096, 8192, 3 * 4096] {
            let (b, pad) = aligned_buffer(len);
            assert_eq!(b.len(), pad + len);
            assert!((b[pad..].as_ptr() as usize).is_multiple_of(DIRECT_ALIGN));
            assert!(b.iter().all(|x| *x == 0));
            assert!(is_aligned(b[pad..].as_ptr(), len, 0));
            assert!(!is_aligned(b[pad..].as_ptr(), len - 1, 0));
        }
    }
}
