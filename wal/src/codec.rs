//! Little-endian, length-prefixed payload fields, with every read bounds-checked.

use crate::error::{Error, Result};

#[derive(Default)]
pub(crate) struct Writer {
    pub(crate) buf: Vec<u8>,
}

impl Writer {
    pub(crate) fn u8(&mut self, v: u8) {
        self.buf.push(v);
    }
    pub(crate) fn u32(&mut self, v: u32) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    pub(crate) fn u64(&mut self, v: u64) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    pub(crate) fn raw(&mut self, v: &[u8]) {
        self.buf.extend_from_slice(v);
    }
    /// `u16` length, then bytes; longer text is refused, never cut.
    pub(crate) fn text(&mut self, field: &'static str, v: &str) -> Result<()> {
        let len = u16::try_from(v.len()).map_err(|_| Error::FieldTooLong {
            field,
            len: v.len(),
            limit: usize::from(u16::MAX),
        })?;
        self.buf.extend_from_slice(&len.to_le_bytes());
        self.buf.extend_from_slice(v.as_bytes());
        Ok(())
    }
}

pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    offset: u64,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a [u8], offset: u64) -> Self {
        Self {
            buf,
            pos: 0,
            offset,
        }
    }
    pub(crate) fn malformed(&self, reason: impl Into<String>) -> Error {
        Error::Malformed {
            offset: self.offset,
            reason: reason.into(),
        }
    }
    pub(crate) fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        if n > self.buf.len() - self.pos {
            return Err(self.malformed(format!("field of {n} bytes past the payload end")));
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }
    pub(crate) fn array<const N: usize>(&mut self) -> Result<[u8; N]> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }
    pub(crate) fn u8(&mut self) -> Result<u8> {
        Ok(self.array::<1>()?[0])
    }
    pub(crate) fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array()?))
    }
    pub(crate) fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array()?))
    }
    pub(crate) fn text(&mut self) -> Result<String> {
        let len = u16::from_le_bytes(self.array()?);
        let raw = self.take(usize::from(len))?;
        String::from_utf8(raw.to_vec()).map_err(|_| self.malformed("text is not UTF-8"))
    }
    /// A count of items each at least `min_item` bytes long, checked against what remains so a
    /// forged count cannot make the caller allocate.
    pub(crate) fn count(&mut self, min_item: usize) -> Result<usize> {
        let n = self.u32()? as usize;
        if n.saturating_mul(min_item) > self.buf.len() - self.pos {
            return Err(self.malformed(format!("count {n} exceeds the payload")));
        }
        Ok(n)
    }
    pub(crate) fn finish(self) -> Result<()> {
        if self.pos != self.buf.len() {
            return Err(self.malformed(format!("{} trailing bytes", self.buf.len() - self.pos)));
        }
        Ok(())
    }
}
