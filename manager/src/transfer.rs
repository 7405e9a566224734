//! Page transfers: a worker's pools (registered with their descriptor), Load (acquired records
//! copied and verified into the worker's pages) and Publish (pages copied out into the store).
//! Every page goes through the bridge's fencing; every page gets its own status, so the engine
//! recomputes exactly the pages that failed.

use std::os::fd::OwnedFd;
use std::sync::Arc;

use orbitkv_gpu_bridge::{AttachedPool, Bridge, Error as BridgeError, PoolSpec};
use orbitkv_segments::RecordMeta;
use orbitkv_state::{CacheGroupId, RankSpec, Ranks, StateKey, TokenRange};
use orbitkv_store::{Pin, StateStore};

use crate::protocol::ErrorCode;
use crate::protocol::PageStatus;
use crate::protocol::message::{LoadPage, PublishPage};
use crate::query::Located;
use crate::session::{Refusal, Session};

/// The page status of a bridge refusal.
pub fn status_of(e: &BridgeError) -> PageStatus {
    match e {
        BridgeError::StaleGeneration { .. } | BridgeError::PageLeased { .. } => {
            PageStatus::StaleGeneration
        }
        BridgeError::StaleEpoch { .. } => PageStatus::StaleEpoch,
        BridgeError::IndexOutOfRange { .. } => PageStatus::OutOfRange,
        BridgeError::UnknownPool { .. } | BridgeError::Detached { .. } => PageStatus::UnknownPool,
        BridgeError::ChangedDuringCopy { .. } => PageStatus::ChangedDuringCopy,
        BridgeError::Geometry(_) | BridgeError::Length { .. } | BridgeError::Region(_) => {
            PageStatus::BadGeometry
        }
        BridgeError::TooManyLeases { .. } | BridgeError::Io { .. } => PageStatus::Refused,
    }
}

/// Registers a worker's pool: the geometry must hold each layout group's page, and the region
/// must match the registration.
pub fn register_pool(
    bridge: &Bridge,
    session: &Session,
    spec: PoolSpec,
    fd: Option<OwnedFd>,
) -> Result<(), Refusal> {
    let refuse = |code, d: String| Refusal { code, detail: d };
    let fd = fd.ok_or_else(|| {
        refuse(
            ErrorCode::Malformed,
            "RegisterPool came without the pool's descriptor".into(),
        )
    })?;
    for g in session.instance.layout.groups() {
        let geo = spec
            .group(g.id.0)
            .map_err(|e| refuse(ErrorCode::Malformed, e.to_string()))?;
        let bytes = geo.bytes_for(&geo.all_layers());
        if bytes != g.page_bytes {
            return Err(refuse(
                ErrorCode::Malformed,
                format!(
                    "pool {} holds {bytes} bytes of group {} per page; the layout says {}",
                    spec.pool, g.id.0, g.page_bytes
                ),
            ));
        }
    }
    let pool = AttachedPool::attach(fd, spec, session.instance.epoch)
        .map_err(|e| refuse(ErrorCode::Malformed, e.to_string()))?;
    bridge
        .register(pool)
        .map_err(|e| refuse(ErrorCode::Malformed, e.to_string()))
}

/// Copies each page's record (pinned under the lease) into the page: verified on the way out of
/// the store, fenced on the way into the page.
pub fn load(
    store: &StateStore,
    bridge: &Bridge,
    epoch: u64,
    pins: &[(Located, Pin)],
    pages: &[LoadPage],
) -> Vec<PageStatus> {
    let mut buf = Vec::new();
    pages
        .iter()
        .map(|p| {
            let rank = RankSpec::from_code(p.rank);
            let Some(&(_, pin)) = pins
                .iter()
                .find(|(l, _)| l.group == p.group && l.rank == rank && l.block == p.block)
            else {
                return PageStatus::Missing;
            };
            match store.get_pinned(pin, &mut buf) {
                Ok(Some(_)) => {}
                Ok(None) => return PageStatus::Missing,
                // A read or checksum failure: the record is dropped, never copied.
                Err(_) => return PageStatus::BadRecord,
            }
            let lease = match bridge.lease(epoch, p.page) {
                Ok(l) => l,
                Err(e) => return status_of(&e),
            };
            let geo = match lease.pool().spec().group(p.group) {
                Ok(g) => *g,
                Err(_) => return PageStatus::BadGeometry,
            };
            if buf.len() as u64 != geo.bytes_for(&geo.all_layers()) || p.layer_end > geo.layers {
                return PageStatus::BadGeometry;
            }
            let from = (u64::from(p.layer_start) * geo.layer_bytes) as usize;
            let to = (u64::from(p.layer_end) * geo.layer_bytes) as usize;
            match bridge.load(&lease, p.group, p.layer_start..p.layer_end, &buf[from..to]) {
                Ok(()) => PageStatus::Ok,
                Err(e) => status_of(&e),
            }
        })
        .collect()
}

/// Copies each page out and stores it as the record its block names. A page reused during its
/// copy is not stored. Returns each page's status and whether every stored record is durable
/// already (the store syncs each put).
pub fn publish(
    store: &StateStore,
    bridge: &Bridge,
    session: &Session,
    pages: &[PublishPage],
) -> (Vec<PageStatus>, bool) {
    let inst: &Arc<crate::session::SealedInstance> = &session.instance;
    let mut buf = Vec::new();
    let mut durable = true;
    let statuses = pages
        .iter()
        .map(|p| {
            let Some(contract) = inst
                .contract
                .groups()
                .iter()
                .find(|c| c.group == CacheGroupId(p.group))
            else {
                return PageStatus::BadGeometry;
            };
            let rank = match (contract.ranks, RankSpec::from_code(p.rank)) {
                (Ranks::Replicated, RankSpec::Replicated) => RankSpec::Replicated,
                // A worker publishes its own shard only.
                (Ranks::Sharded(_), RankSpec::Rank(r)) if r == session.rank => RankSpec::Rank(r),
                _ => return PageStatus::Refused,
            };
            let slot = match rank {
                RankSpec::Replicated => 0,
                RankSpec::Rank(r) => r as usize,
            };
            let Some(format) = contract.formats.get(slot).copied() else {
                return PageStatus::BadGeometry;
            };
            let key = |h: &[u8]| {
                StateKey::new(
                    inst.namespace,
                    inst.domain,
                    h,
                    contract.group,
                    contract.component,
                    rank,
                )
            };
            let (Ok(k), Ok(range)) = (key(&p.hash), TokenRange::new(p.start, p.end)) else {
                return PageStatus::BadGeometry;
            };
            let parent = if p.parent.is_empty() {
                None
            } else {
                match key(&p.parent) {
                    Ok(k) => Some(k),
                    Err(_) => return PageStatus::BadGeometry,
                }
            };
            let lease = match bridge.lease(inst.epoch, p.page) {
                Ok(l) => l,
                Err(e) => return status_of(&e),
            };
            if let Err(e) = bridge.publish(&lease, p.group, &mut buf) {
                return status_of(&e);
            }
            drop(lease);
            let meta = RecordMeta {
                key: k,
                parent,
                range,
                format,
            };
            match store.put(&[(meta, buf.as_slice())]) {
                Ok(receipt) => {
                    durable &= receipt.durable;
                    PageStatus::Ok
                }
                Err(_) => PageStatus::Refused,
            }
        })
        .collect();
    (statuses, durable)
}
