//! Little-endian field access on byte slices whose length the caller has already checked.
//!
//! Every decoder first proves `bytes.len() >= N` for its fixed-size structure, then reads fields
//! at constant offsets below `N`; these helpers return zero rather than panic if a caller ever
//! gets that wrong, and the structure's checksum then fails.

pub(crate) fn u8_at(b: &[u8], off: usize) -> u8 {
    b.get(off).copied().unwrap_or(0)
}

fn array<const N: usize>(b: &[u8], off: usize) -> [u8; N] {
    let mut out = [0u8; N];
    if let Some(s) = b.get(off..off + N) {
        out.copy_from_slice(s);
    }
    out
}

pub(crate) fn u16_at(b: &[u8], off: usize) -> u16 {
    u16::from_le_bytes(array(b, off))
}

pub(crate) fn u32_at(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes(array(b, off))
}

pub(crate) fn u64_at(b: &[u8], off: usize) -> u64 {
    u64::from_le_bytes(array(b, off))
}

pub(crate) fn bytes_at<const N: usize>(b: &[u8], off: usize) -> [u8; N] {
    array(b, off)
}

pub(crate) fn put(b: &mut [u8], off: usize, v: &[u8]) {
    if let Some(d) = b.get_mut(off..off + v.len()) {
        d.copy_from_slice(v);
    }
}

pub(crate) fn put_u16(b: &mut [u8], off: usize, v: u16) {
    put(b, off, &v.to_le_bytes());
}

pub(crate) fn put_u32(b: &mut [u8], off: usize, v: u32) {
    put(b, off, &v.to_le_bytes());
}

pub(crate) fn put_u64(b: &mut [u8], off: usize, v: u64) {
    put(b, off, &v.to_le_bytes());
}

/// True when every byte is zero.
pub(crate) fn all_zero(b: &[u8]) -> bool {
    b.iter().all(|&x| x == 0)
}
