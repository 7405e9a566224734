//! Where things lie in a pool region: the header, the page state words and the pages.
//! The layout is computed from the registration only, never read from the region.
//! Its byte format is in `docs/protocol.md` ("Host page pool").

#![forbid(unsafe_code)]

use crate::error::{Error, Result};
use crate::pool::PoolSpec;

/// The region's first bytes.
pub const REGION_MAGIC: [u8; 8] = *b"OKVPOOL\0";
/// The region layout's version.
pub const REGION_VERSION: u32 = 1;
/// Bytes of the region header.
pub const HEADER_LEN: usize = 64;
/// Page data starts on a boundary of this many bytes.
pub const DATA_ALIGN: u64 = 4096;

/// Where things lie in a pool's region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Layout {
    /// Offset of page 0 (for a states-only region, its end).
    pub(crate) data_offset: u64,
    /// Length of the whole region.
    pub(crate) len: u64,
    /// Whether the pages follow the state words (a host pool) or live elsewhere, in device
    /// memory (the region holds a device pool's state words only).
    pub(crate) holds_pages: bool,
}

impl Layout {
    pub(crate) fn of(spec: &PoolSpec, holds_pages: bool) -> Result<Self> {
        let words = HEADER_LEN as u64 + 8 * u64::from(spec.pages);
        let data_offset = words.next_multiple_of(DATA_ALIGN);
        let pages = if holds_pages { spec.pages } else { 0 };
        let len = u64::from(pages)
            .checked_mul(spec.page_bytes)
            .and_then(|x| x.checked_add(data_offset))
            .filter(|l| usize::try_from(*l).is_ok() && *l <= isize::MAX as u64)
            .ok_or_else(|| {
                Error::Geometry("the pool is larger than this machine addresses".into())
            })?;
        Ok(Self {
            data_offset,
            len,
            holds_pages,
        })
    }

    pub(crate) fn header(&self, spec: &PoolSpec) -> [u8; HEADER_LEN] {
        let mut h = [0u8; HEADER_LEN];
        h[0..8].copy_from_slice(&REGION_MAGIC);
        h[8..12].copy_from_slice(&REGION_VERSION.to_le_bytes());
        h[12..16].copy_from_slice(&spec.pool.0.to_le_bytes());
        h[16..24].copy_from_slice(&spec.page_bytes.to_le_bytes());
        h[24..28].copy_from_slice(&spec.pages.to_le_bytes());
        h[28..32].copy_from_slice(&u32::from(!self.holds_pages).to_le_bytes());
        h[32..40].copy_from_slice(&self.data_offset.to_le_bytes());
        h
    }

    /// Checks a region's header against the registration.
    pub(crate) fn check_header(&self, spec: &PoolSpec, h: &[u8; HEADER_LEN]) -> Result<()> {
        let want = self.header(spec);
        if h[0..8] != REGION_MAGIC {
            return Err(Error::Region("not a pool region (bad magic)".into()));
        }
        if h[8..12] != want[8..12] {
            return Err(Error::Region(format!(
                "region layout version {}, this build reads {REGION_VERSION}",
                u32::from_le_bytes([h[8], h[9], h[10], h[11]])
            )));
        }
        if h[28..32] != want[28..32] {
            return Err(Error::Region(if self.holds_pages {
                "the region holds only page state words (a device pool's), not the pages of a host pool".into()
            } else {
                "the region holds a host pool's pages, not a device pool's state words".into()
            }));
        }
        if h[12..40] != want[12..40] {
            return Err(Error::Region(
                "the region's pool id, page size, page count or data offset differ from the registration"
                    .into(),
            ));
        }
        Ok(())
    }

    /// Byte offset of page `index`'s first byte (meaningful when the region holds pages).
    pub(crate) fn page_base(&self, spec: &PoolSpec, index: u32) -> u64 {
        self.data_offset + u64::from(index) * spec.page_bytes
    }
}

/// Byte offset of page `index`'s state word.
pub(crate) fn word_at(index: u32) -> usize {
    HEADER_LEN + 8 * index as usize
}
