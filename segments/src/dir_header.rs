//! The data-directory header (`orbitkv.dir`): records the format version of a store, so an
//! incompatible store is recognised before anything else is read. Fixed 64 bytes.

use crate::crc::crc32c;
use crate::error::{Error, Result};
use crate::fixed::{self, Fixed, VersionField};
use crate::le::{all_zero, bytes_at, put, put_u32, put_u64, u32_at, u64_at};

/// File name of the header inside a data directory.
pub const DIR_HEADER_FILE: &str = "orbitkv.dir";
/// Encoded size.
pub const DIR_HEADER_LEN: usize = 64;
/// Magic number.
pub const DIR_MAGIC: [u8; 8] = *b"ORBITKVD";
/// The store format version this build reads and writes.
pub const STORE_FORMAT_VERSION: u32 = 1;

/// A data directory's identity and format version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DataDirHeader {
    /// Random id binding segments to their directory.
    pub directory_id: [u8; 16],
    /// Creation time, milliseconds since the Unix epoch.
    pub created_unix_ms: u64,
    /// Reserved flags; zero in version 1.
    pub flags: u32,
}

impl DataDirHeader {
    /// Encodes the header.
    pub fn encode(&self) -> [u8; DIR_HEADER_LEN] {
        let mut b = [0u8; DIR_HEADER_LEN];
        put(&mut b, 0, &DIR_MAGIC);
        put_u32(&mut b, 8, STORE_FORMAT_VERSION);
        put_u32(&mut b, 12, self.flags);
        put(&mut b, 16, &self.directory_id);
        put_u64(&mut b, 32, self.created_unix_ms);
        let crc = crc32c(&b[..60]);
        put_u32(&mut b, 60, crc);
        b
    }

    /// Decodes and verifies a header. An unsupported version is reported as such (after the
    /// checksum verifies), so the operator learns the store is incompatible, not corrupt.
    pub fn decode(bytes: &[u8]) -> Result<Self> {
        const WHAT: &str = "data-directory header";
        fixed::verify(
            bytes,
            0,
            Fixed {
                what: WHAT,
                len: DIR_HEADER_LEN,
                magic: &DIR_MAGIC,
                crc_at: 60,
                version: VersionField::U32(8),
                supported: STORE_FORMAT_VERSION,
            },
        )?;
        let flags = u32_at(bytes, 12);
        if flags != 0 || !all_zero(&bytes[40..60]) {
            return Err(Error::InvalidField {
                what: WHAT,
                offset: 0,
                field: "flags/reserved",
                reason: "must be zero in version 1".to_owned(),
            });
        }
        Ok(Self {
            directory_id: bytes_at(bytes, 16),
            created_unix_ms: u64_at(bytes, 32),
            flags,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_version_refusal() {
        let h = DataDirHeader {
            directory_id: [7; 16],
            created_unix_ms: 1_764_000_000_000,
            flags: 0,
        };
        let b = h.encode();
        assert_eq!(DataDirHeader::decode(&b).unwrap(), h);
        let mut v2 = b;
        put_u32(&mut v2, 8, 2);
        let crc = crc32c(&v2[..60]);
        put_u32(&mut v2, 60, crc);
        assert!(matches!(
            DataDirHeader::decode(&v2),
            Err(Error::UnsupportedVersion { found: 2, .. })
        ));
        for cut in 0..DIR_HEADER_LEN {
            assert!(DataDirHeader::decode(&b[..cut]).is_err());
        }
        let mut flipped = b;
        flipped[20] ^= 1;
        assert!(matches!(
            DataDirHeader::decode(&flipped),
            Err(Error::ChecksumMismatch { .. })
        ));
    }
}
