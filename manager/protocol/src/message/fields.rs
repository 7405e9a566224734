//! Field encodings that several message bodies share: names, native hashes, page references.

use orbitkv_gpu_bridge::{PageRef, PoolId};

use super::{MAX_NAME, MAX_NATIVE_HASH};
use crate::error::{ProtocolError, Result};
use crate::wire::{Reader, Writer};

pub(super) fn name(w: &mut Writer, s: &str) {
    w.bytes16(s.as_bytes());
}

pub(super) fn read_name(r: &mut Reader<'_>, what: &'static str) -> Result<String> {
    let s = r.text16(what)?;
    if s.len() > MAX_NAME {
        return Err(ProtocolError::BadField {
            what,
            why: format!("{} bytes, at most {MAX_NAME}", s.len()),
        });
    }
    Ok(s)
}

pub(super) fn read_hash(r: &mut Reader<'_>, what: &'static str, empty_ok: bool) -> Result<Vec<u8>> {
    let h = r.bytes8(what)?;
    if h.len() > MAX_NATIVE_HASH || (h.is_empty() && !empty_ok) {
        return Err(ProtocolError::BadField {
            what,
            why: format!("a native hash of {} bytes", h.len()),
        });
    }
    Ok(h.to_vec())
}

pub(super) fn page_ref(w: &mut Writer, p: &PageRef) {
    w.u32(p.pool.0).u32(p.index).u64(p.generation);
}

pub(super) fn read_page_ref(r: &mut Reader<'_>) -> Result<PageRef> {
    Ok(PageRef {
        pool: PoolId(r.u32("page pool")?),
        index: r.u32("page index")?,
        generation: r.u64("page generation")?,
    })
}
