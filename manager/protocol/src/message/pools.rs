//! The pool messages: RegisterPool (a worker's page pool, its descriptor beside the frame) and
//! PoolRegistered.

use orbitkv_gpu_bridge::{GroupGeometry, PageMemory, PoolId, PoolSpec};

use super::{Body, Message, Token};
use crate::error::{ProtocolError, Result};
use crate::wire::{Reader, Writer};

/// Pool flags (a `u8`): bit 0, the groups alias one another.
const POOL_ALIASED: u8 = 1;
/// Group flags (a `u8`): bit 0, the layers lie inside each run.
const GROUP_LAYERS_INSIDE: u8 = 1;

impl Body for PoolSpec {
    fn encode(&self, w: &mut Writer) {
        let s = self;
        w.u32(s.pool.0)
            .u64(s.page_bytes)
            .u32(s.pages)
            .u8(if s.aliased { POOL_ALIASED } else { 0 })
            .u32(s.groups.len() as u32);
        for g in &s.groups {
            w.u32(g.group)
                .u32(g.layers)
                .u64(g.offset)
                .u64(g.page_stride)
                .u64(g.layer_stride)
                .u64(g.layer_bytes)
                .u32(g.parts)
                .u64(g.part_stride)
                .u8(if g.layers_inside {
                    GROUP_LAYERS_INSIDE
                } else {
                    0
                });
        }
    }

    fn decode(r: &mut Reader<'_>) -> Result<Self> {
        let pool = PoolId(r.u32("pool")?);
        let page_bytes = r.u64("page size")?;
        let pages = r.u32("page count")?;
        let flags = r.u8("pool flags")?;
        if flags & !POOL_ALIASED != 0 {
            return Err(ProtocolError::BadField {
                what: "pool flags",
                why: format!("unknown bits {flags:#04x}"),
            });
        }
        let n = r.count("cache groups", 32)?;
        if n > orbitkv_state::layout::MAX_GROUPS {
            return Err(ProtocolError::BadField {
                what: "cache groups",
                why: format!(
                    "{n} groups, more than a layout's {}",
                    orbitkv_state::layout::MAX_GROUPS
                ),
            });
        }
        let mut groups = Vec::with_capacity(n);
        for _ in 0..n {
            groups.push(GroupGeometry {
                group: r.u32("group")?,
                layers: r.u32("layers")?,
                offset: r.u64("offset")?,
                page_stride: r.u64("page stride")?,
                layer_stride: r.u64("layer stride")?,
                layer_bytes: r.u64("layer size")?,
                parts: r.u32("parts")?,
                part_stride: r.u64("part stride")?,
                layers_inside: match r.u8("group flags")? {
                    0 => false,
                    GROUP_LAYERS_INSIDE => true,
                    x => {
                        return Err(ProtocolError::BadField {
                            what: "group flags",
                            why: format!("unknown bits {x:#04x}"),
                        });
                    }
                },
            });
        }
        Ok(PoolSpec {
            pool,
            page_bytes,
            pages,
            aliased: flags & POOL_ALIASED != 0,
            groups,
        })
    }
}

impl Body for PageMemory {
    fn encode(&self, w: &mut Writer) {
        match self {
            PageMemory::Host => {
                w.u8(0);
            }
            PageMemory::Engine { offset } => {
                w.u8(2).u64(*offset);
            }
            PageMemory::Device {
                device,
                uuid,
                ipc_handle,
                offset,
            } => {
                w.u8(1)
                    .u32(u32::from_le_bytes(device.to_le_bytes()))
                    .raw(uuid)
                    .raw(ipc_handle)
                    .u64(*offset);
            }
        }
    }

    fn decode(r: &mut Reader<'_>) -> Result<Self> {
        match r.u8("page memory")? {
            0 => Ok(PageMemory::Host),
            1 => Ok(PageMemory::Device {
                device: i32::from_le_bytes(r.u32("device")?.to_le_bytes()),
                uuid: r.array("device UUID")?,
                ipc_handle: r.array("IPC handle")?,
                offset: r.u64("offset in the allocation")?,
            }),
            2 => Ok(PageMemory::Engine {
                offset: r.u64("offset in the engine memory")?,
            }),
            other => Err(ProtocolError::BadField {
                what: "page memory",
                why: format!("unknown kind {other}"),
            }),
        }
    }
}

pub(super) fn encode_register_pool(
    w: &mut Writer,
    token: &Token,
    spec: &PoolSpec,
    memory: &PageMemory,
) {
    w.raw(token);
    spec.encode(w);
    memory.encode(w);
}

pub(super) fn decode_register_pool(r: &mut Reader<'_>) -> Result<Message> {
    Ok(Message::RegisterPool {
        token: r.array("token")?,
        spec: PoolSpec::decode(r)?,
        memory: PageMemory::decode(r)?,
    })
}

pub(super) fn encode_unregister_pool(w: &mut Writer, token: &Token, pool: PoolId) {
    w.raw(token).u32(pool.0);
}

pub(super) fn decode_unregister_pool(r: &mut Reader<'_>) -> Result<Message> {
    Ok(Message::UnregisterPool {
        token: r.array("token")?,
        pool: PoolId(r.u32("pool")?),
    })
}

pub(super) fn encode_pool_registered(w: &mut Writer, pool: PoolId) {
    w.u32(pool.0);
}

pub(super) fn decode_pool_registered(r: &mut Reader<'_>) -> Result<Message> {
    Ok(Message::PoolRegistered {
        pool: PoolId(r.u32("pool")?),
    })
}
