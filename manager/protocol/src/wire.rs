//! Little-endian field encoding with bounds-checked reads: a decoder never panics and never
//! allocates more than the bytes it was given can justify.

use super::error::{ProtocolError, Result};

/// Appends fields to a message body.
#[derive(Debug, Default)]
pub struct Writer {
    buf: Vec<u8>,
}

impl Writer {
    /// An empty body.
    pub fn new() -> Self {
        Self::default()
    }
    /// The bytes written.
    pub fn into_bytes(self) -> Vec<u8> {
        self.buf
    }
    /// A `u8`.
    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.buf.push(v);
        self
    }
    /// A `u16`.
    pub fn u16(&mut self, v: u16) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// A `u32`.
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// A `u64`.
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// Fixed bytes, no length.
    pub fn raw(&mut self, v: &[u8]) -> &mut Self {
        self.buf.extend_from_slice(v);
        self
    }
    /// A `u8` length, then the bytes (at most 255; longer is cut — callers check first).
    pub fn bytes8(&mut self, v: &[u8]) -> &mut Self {
        let n = v.len().min(u8::MAX as usize);
        self.u8(n as u8).raw(&v[..n])
    }
    /// A `u16` length, then the bytes (at most 65,535; longer is cut — callers check first).
    pub fn bytes16(&mut self, v: &[u8]) -> &mut Self {
        let n = v.len().min(u16::MAX as usize);
        self.u16(n as u16).raw(&v[..n])
    }
    /// A `u32` length, then the bytes.
    pub fn bytes32(&mut self, v: &[u8]) -> &mut Self {
        let n = v.len().min(u32::MAX as usize);
        self.u32(n as u32).raw(&v[..n])
    }
}

/// Reads fields from a message body.
#[derive(Debug)]
pub struct Reader<'a> {
    buf: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    /// Reads `buf` from its start.
    pub fn new(buf: &'a [u8]) -> Self {
        Self { buf, at: 0 }
    }

    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8]> {
        let end = self
            .at
            .checked_add(n)
            .filter(|e| *e <= self.buf.len())
            .ok_or(ProtocolError::Truncated {
                what,
                need: n,
                have: self.buf.len() - self.at,
            })?;
        let s = &self.buf[self.at..end];
        self.at = end;
        Ok(s)
    }

    /// A `u8`.
    pub fn u8(&mut self, what: &'static str) -> Result<u8> {
        Ok(self.take(1, what)?[0])
    }
    /// A `u16`.
    pub fn u16(&mut self, what: &'static str) -> Result<u16> {
        let b = self.take(2, what)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }
    /// A `u32`.
    pub fn u32(&mut self, what: &'static str) -> Result<u32> {
        let b = self.take(4, what)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    /// A `u64`.
    pub fn u64(&mut self, what: &'static str) -> Result<u64> {
        let b = self.take(8, what)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }
    /// `N` fixed bytes.
    pub fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N]> {
        let b = self.take(N, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(b);
        Ok(a)
    }
    /// A `u8`-length byte string.
    pub fn bytes8(&mut self, what: &'static str) -> Result<&'a [u8]> {
        let n = self.u8(what)? as usize;
        self.take(n, what)
    }
    /// A `u16`-length byte string.
    pub fn bytes16(&mut self, what: &'static str) -> Result<&'a [u8]> {
        let n = self.u16(what)? as usize;
        self.take(n, what)
    }
    /// A `u32`-length byte string.
    pub fn bytes32(&mut self, what: &'static str) -> Result<&'a [u8]> {
        let n = self.u32(what)? as usize;
        self.take(n, what)
    }
    /// UTF-8 text with a `u16` length.
    pub fn text16(&mut self, what: &'static str) -> Result<String> {
        let b = self.bytes16(what)?;
        std::str::from_utf8(b)
            .map(str::to_owned)
            .map_err(|_| ProtocolError::BadField {
                what,
                why: "not UTF-8".into(),
            })
    }
    /// A count of items each at least `min_item` bytes long: refused when the rest of the body
    /// cannot hold that many, so a decoder never reserves memory for items that are not there.
    pub fn count(&mut self, what: &'static str, min_item: usize) -> Result<usize> {
        let n = self.u32(what)? as usize;
        let room = self.remaining() / min_item.max(1);
        if n > room {
            return Err(ProtocolError::Truncated {
                what,
                need: n.saturating_mul(min_item.max(1)),
                have: self.remaining(),
            });
        }
        Ok(n)
    }
    /// Bytes not read yet.
    pub fn remaining(&self) -> usize {
        self.buf.len() - self.at
    }
    /// Fails unless every byte was read.
    pub fn finish(&self, what: &'static str) -> Result<()> {
        if self.remaining() != 0 {
            return Err(ProtocolError::TrailingBytes {
                what,
                extra: self.remaining(),
            });
        }
        Ok(())
    }
}
