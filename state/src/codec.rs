//! Little-endian, length-framed building blocks shared by every canonical encoding in this crate.
//!
//! Integers are little-endian; a variable-length value is a length prefix then its bytes. A named
//! field (used for digests) is `u32 name length ‖ name ‖ u64 value length ‖ value`.

use crate::error::{Error, Result};

/// Appends canonical fields to a byte buffer.
#[derive(Debug, Default, Clone)]
pub(crate) struct Writer {
    buf: Vec<u8>,
}

impl Writer {
    pub(crate) fn with_capacity(capacity: usize) -> Self {
        Self {
            buf: Vec::with_capacity(capacity),
        }
    }
    pub(crate) fn u8(&mut self, v: u8) -> &mut Self {
        self.buf.push(v);
        self
    }
    pub(crate) fn u16(&mut self, v: u16) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub(crate) fn u32(&mut self, v: u32) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub(crate) fn u64(&mut self, v: u64) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub(crate) fn raw(&mut self, v: &[u8]) -> &mut Self {
        self.buf.extend_from_slice(v);
        self
    }
    /// `u16` length then bytes; callers guarantee `v.len() <= u16::MAX`.
    pub(crate) fn bytes16(&mut self, v: &[u8]) -> &mut Self {
        let len = u16::try_from(v.len()).unwrap_or(u16::MAX);
        self.u16(len);
        self.raw(&v[..usize::from(len)])
    }
    /// A named field for digests: `u32 name len ‖ name ‖ u64 value len ‖ value`.
    pub(crate) fn field(&mut self, name: &str, value: &[u8]) -> &mut Self {
        self.u32(len_u32(name.len()));
        self.raw(name.as_bytes());
        self.u64(value.len() as u64);
        self.raw(value)
    }
    pub(crate) fn into_bytes(self) -> Vec<u8> {
        self.buf
    }
}

/// Saturating conversion for lengths that callers have already bounded.
pub(crate) fn len_u32(len: usize) -> u32 {
    u32::try_from(len).unwrap_or(u32::MAX)
}

/// Reads canonical fields from a borrowed slice; every read is bounds-checked.
#[derive(Debug)]
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    what: &'static str,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a [u8], what: &'static str) -> Self {
        Self { buf, pos: 0, what }
    }
    pub(crate) fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let available = self.buf.len() - self.pos;
        if n > available {
            return Err(Error::Truncated {
                what: self.what,
                offset: self.pos,
                needed: n - available,
            });
        }
        let out = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(out)
    }
    pub(crate) fn array<const N: usize>(&mut self) -> Result<[u8; N]> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }
    pub(crate) fn u8(&mut self) -> Result<u8> {
        Ok(self.array::<1>()?[0])
    }
    pub(crate) fn u16(&mut self) -> Result<u16> {
        Ok(u16::from_le_bytes(self.array()?))
    }
    pub(crate) fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array()?))
    }
    pub(crate) fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array()?))
    }
    pub(crate) fn bytes16(&mut self) -> Result<&'a [u8]> {
        let len = self.u16()?;
        self.take(usize::from(len))
    }
    pub(crate) fn what(&self) -> &'static str {
        self.what
    }
    pub(crate) fn finish(self) -> Result<()> {
        let extra = self.buf.len() - self.pos;
        if extra != 0 {
            return Err(Error::TrailingBytes {
                what: self.what,
                extra,
            });
        }
        Ok(())
    }
}

/// SHA-256 of `bytes` as a plain array.
pub(crate) fn sha256(bytes: &[u8]) -> [u8; 32] {
    use sha2::Digest;
    sha2::Sha256::digest(bytes).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reader_bounds() {
        let mut w = Writer::default();
        w.u8(1).u16(2).u32(3).u64(4).bytes16(b"abc");
        let bytes = w.into_bytes();
        let mut r = Reader::new(&bytes, "t");
        assert_eq!(r.u8().unwrap(), 1);
        assert_eq!(r.u16().unwrap(), 2);
        assert_eq!(r.u32().unwrap(), 3);
        assert_eq!(r.u64().unwrap(), 4);
        assert_eq!(r.bytes16().unwrap(), b"abc");
        r.finish().unwrap();

        let mut r = Reader::new(&bytes[..3], "t");
        r.u8().unwrap();
        assert_eq!(
            r.u32(),
            Err(Error::Truncated {
                what: "t",
                offset: 1,
                needed: 2
            })
        );
        let r = Reader::new(&bytes, "t");
        assert!(matches!(r.finish(), Err(Error::TrailingBytes { .. })));
    }
}
