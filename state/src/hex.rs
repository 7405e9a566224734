//! Lowercase hexadecimal encoding, the only textual form digests take in OrbitKV.

use crate::error::{Error, Result};

const DIGITS: &[u8; 16] = b"0123456789abcdef";

/// Encodes `bytes` as lowercase hex.
pub fn encode(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() * 2);
    for &b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0x0f)]));
    }
    out
}

/// Decodes hex (either case) into bytes; `what` names the input in the error.
pub fn decode(text: &str, what: &'static str) -> Result<Vec<u8>> {
    let raw = text.as_bytes();
    if !raw.len().is_multiple_of(2) {
        return Err(Error::InvalidHex {
            what,
            reason: "odd number of digits",
        });
    }
    let mut out = Vec::with_capacity(raw.len() / 2);
    for pair in raw.chunks_exact(2) {
        let hi = nibble(pair[0]).ok_or(Error::InvalidHex {
            what,
            reason: "non-hex character",
        })?;
        let lo = nibble(pair[1]).ok_or(Error::InvalidHex {
            what,
            reason: "non-hex character",
        })?;
        out.push((hi << 4) | lo);
    }
    Ok(out)
}

/// Decodes exactly `N` bytes of hex (either case).
pub fn decode_array<const N: usize>(text: &str, what: &'static str) -> Result<[u8; N]> {
    let bytes = decode(text, what)?;
    bytes.try_into().map_err(|v: Vec<u8>| Error::InvalidLength {
        what,
        expected: N,
        actual: v.len(),
    })
}

/// True when `text` is exactly `len` lowercase hex digits.
pub fn is_lower_hex(text: &str, len: usize) -> bool {
    text.len() == len && text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

fn nibble(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let bytes = [0u8, 1, 0x7f, 0x80, 0xfe, 0xff];
        assert_eq!(encode(&bytes), "00017f80feff");
        assert_eq!(decode("00017F80FEFF", "t").unwrap(), bytes);
    }

    #[test]
    fn rejects_bad_input() {
        assert!(decode("abc", "t").is_err());
        assert!(decode("zz", "t").is_err());
        assert!(decode_array::<2>("abcdef", "t").is_err());
        assert!(is_lower_hex("ab", 2));
        assert!(!is_lower_hex("AB", 2));
        assert!(!is_lower_hex("ab", 4));
    }
}
