//! The checks every fixed-size, checksummed structure shares, in one place: length, magic, the CRC
//! over every byte before it, then the version. A CRC that fails where the version is also one this
//! build does not read is reported as an unsupported version — a later format may lay its header
//! out differently — so an incompatible store is named as such, not as corrupt.

use crate::crc::crc32c;
use crate::error::{Checksum, Error, Result};
use crate::le::{u8_at, u32_at};

/// Where a structure keeps its version field.
#[derive(Debug, Clone, Copy)]
pub(crate) enum VersionField {
    /// One byte at this offset.
    U8(usize),
    /// A little-endian u32 at this offset.
    U32(usize),
}

/// A fixed-size structure's layout, for [`verify`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct Fixed {
    pub(crate) what: &'static str,
    pub(crate) len: usize,
    pub(crate) magic: &'static [u8],
    /// The CRC32C of bytes `0..crc_at` is stored at `crc_at`.
    pub(crate) crc_at: usize,
    pub(crate) version: VersionField,
    pub(crate) supported: u32,
}

/// Verifies `bytes` (at least `spec.len` long) against `spec`; `offset` is its position, for errors.
pub(crate) fn verify(bytes: &[u8], offset: u64, spec: Fixed) -> Result<()> {
    let what = spec.what;
    if bytes.len() < spec.len {
        if bytes.len() >= spec.magic.len() && bytes[..spec.magic.len()] != *spec.magic {
            return Err(Error::BadMagic { what, offset });
        }
        return Err(Error::Truncated {
            what,
            offset,
            needed: (spec.len - bytes.len()) as u64,
        });
    }
    if bytes[..spec.magic.len()] != *spec.magic {
        return Err(Error::BadMagic { what, offset });
    }
    let found = match spec.version {
        VersionField::U8(at) => u32::from(u8_at(bytes, at)),
        VersionField::U32(at) => u32_at(bytes, at),
    };
    let unsupported = Error::UnsupportedVersion {
        what,
        offset,
        found,
        supported: spec.supported,
    };
    let expected = u32_at(bytes, spec.crc_at);
    let actual = crc32c(&bytes[..spec.crc_at]);
    if expected != actual {
        if found != spec.supported {
            return Err(unsupported);
        }
        return Err(Error::ChecksumMismatch {
            what,
            kind: Checksum::Header,
            offset,
            expected,
            actual,
        });
    }
    if found != spec.supported {
        return Err(unsupported);
    }
    Ok(())
}
