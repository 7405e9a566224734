//! Page transfers: a worker's pools (registered with their descriptor), Load (acquired records
//! copied and verified into the worker's pages) and Publish (pages copied out into the store).
//! Every page goes through the bridge's fencing; every page gets its own status, so the engine
//! recomputes exactly the pages that failed.
//! It is long because pool registration, Load and Publish share the fencing and the status
//! mapping at its top.

use std::cell::Cell;
use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::Arc;

use orbitkv_gpu_bridge::staging::Item;
use orbitkv_gpu_bridge::{
    AttachedPool, Bridge, CopyOut, Error as BridgeError, PageLease, PageMemory, PagePool, PoolId,
    PoolSpec,
};
use orbitkv_protocol::ErrorCode;
use orbitkv_protocol::PageStatus;
use orbitkv_protocol::message::{LoadPage, PublishPage};
use orbitkv_segments::RecordMeta;
use orbitkv_state::{CacheGroupId, RankSpec, Ranks, StateKey, TokenRange};
use orbitkv_store::{FrameBuf, Pin, Prepared, Retry, StateStore};

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
        BridgeError::TooManyLeases { .. } => PageStatus::RetryLater,
        BridgeError::Io { .. } | BridgeError::Device { .. } => PageStatus::Refused,
    }
}

/// The page status of a record the store did not take: to be published again later, refused
/// for good, or never storable as named.
pub fn store_status(e: &orbitkv_store::Error) -> PageStatus {
    match e.retry() {
        Retry::After(_) => PageStatus::RetryLater,
        Retry::Never => PageStatus::Refused,
        Retry::Rejected => PageStatus::Rejected,
    }
}

/// The most pools one connection may hold: each keeps a mapping and may keep a descriptor.
/// An engine rank registers one pool per device or component.
pub const MAX_POOLS_PER_CONNECTION: usize = 64;

/// Registers a worker's pool: the geometry must hold each layout group's page, and the region
/// must match the registration (a host pool's pages, or a device pool's state words).
/// A pool whose engine memory is copied through its descriptor is refused once the process
/// keeps more than `max_kept_files` such descriptors.
pub fn register_pool(
    bridge: &Bridge,
    session: &Session,
    spec: PoolSpec,
    memory: PageMemory,
    fds: Vec<OwnedFd>,
    max_kept_files: usize,
) -> Result<(), Refusal> {
    let refuse = |code, d: String| Refusal::new(code, d);
    if bridge.len() >= MAX_POOLS_PER_CONNECTION && !bridge.holds(spec.pool) {
        return Err(refuse(
            ErrorCode::LimitExceeded,
            format!("a connection holds at most {MAX_POOLS_PER_CONNECTION} pools"),
        ));
    }
    // The region first; for a pool in memory the engine allocated, that memory second.
    let mut fds = fds.into_iter();
    let fd = fds.next().ok_or_else(|| {
        refuse(
            ErrorCode::Malformed,
            "RegisterPool came without the pool's descriptor".into(),
        )
    })?;
    // A pool may hold some of the layout's groups (SGLang keeps one per component); each it
    // holds must be the layout's, a page of it as large as the rank's format says.
    let layout = &session.instance.layout;
    for geo in &spec.groups {
        let id = CacheGroupId(geo.group);
        let Some(format) = layout.format_of(id, session.rank) else {
            return Err(refuse(
                ErrorCode::Malformed,
                format!(
                    "pool {} holds group {}, which the instance's layout does not have",
                    spec.pool, geo.group
                ),
            ));
        };
        let bytes = geo.bytes_for(&geo.all_layers());
        let want = format.record_bytes().unwrap_or(0);
        if bytes != want {
            return Err(refuse(
                ErrorCode::Malformed,
                format!(
                    "pool {} holds {bytes} bytes of group {} per page; rank {}'s format says {want}",
                    spec.pool, geo.group, session.rank
                ),
            ));
        }
    }
    let epoch = session.instance.epoch;
    let pool: Arc<dyn PagePool> = match memory {
        PageMemory::Host => AttachedPool::attach(fd, spec, epoch)
            .map_err(|e| refuse(ErrorCode::Malformed, e.to_string()))?,
        PageMemory::Engine { offset } => {
            let memory = fds.next().ok_or_else(|| {
                refuse(
                    ErrorCode::Malformed,
                    "a pool in engine memory needs two descriptors: its states-only region, then the memory".into(),
                )
            })?;
            let pool = AttachedPool::attach_engine_memory(fd, memory, offset, spec, epoch)
                .map_err(|e| refuse(ErrorCode::Malformed, e.to_string()))?;
            // Counted once open: a race past the bound refuses both rather than neither.
            let kept = orbitkv_gpu_bridge::host::kept_descriptors();
            if pool.copies_through_file() && kept > max_kept_files {
                return Err(refuse(
                    ErrorCode::LimitExceeded,
                    format!(
                        "the daemon keeps at most {max_kept_files} descriptors of engine memory not sealed against shrinking; seal it (F_SEAL_SHRINK: it is then mapped) or unregister pools"
                    ),
                ));
            }
            pool
        }
        PageMemory::Device {
            device,
            uuid,
            ipc_handle,
            offset,
        } => {
            let states = orbitkv_gpu_bridge::FencedStates::attach(fd, &spec)
                .map_err(|e| refuse(ErrorCode::Malformed, e.to_string()))?;
            let device = DeviceName { device, uuid };
            device_pool(spec, epoch, states, device, ipc_handle, offset)?
        }
    };
    bridge
        .register(pool)
        .map_err(|e| refuse(ErrorCode::Malformed, e.to_string()))
}

/// Pinned staging memory of each device pool (two halves: one filled while the other drains).
#[cfg(feature = "cuda")]
pub const DEVICE_STAGING_BYTES: usize = 64 << 20;

/// The device a device pool names: by UUID when the engine sent one, else by ordinal.
struct DeviceName {
    device: i32,
    uuid: [u8; 16],
}

impl std::fmt::Display for DeviceName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.uuid == [0; 16] {
            write!(f, "CUDA device {}", self.device)
        } else {
            let hex: String = self.uuid.iter().map(|b| format!("{b:02x}")).collect();
            write!(f, "CUDA device {hex}")
        }
    }
}

/// A device pool: the driver and device opened, the engine's allocation opened from its IPC
/// handle (and checked to hold the pool and to lie on that device), copies staged through
/// pinned memory. Without the CUDA backend every device pool is refused, saying why.
fn device_pool(
    spec: PoolSpec,
    epoch: u64,
    states: orbitkv_gpu_bridge::FencedStates,
    device: DeviceName,
    ipc_handle: [u8; 64],
    offset: u64,
) -> Result<Arc<dyn PagePool>, Refusal> {
    let pool = spec.pool;
    #[cfg(feature = "cuda")]
    {
        use orbitkv_gpu_bridge::cuda::{Cuda, CudaPool, DeviceRegion};
        let refuse = |e: BridgeError| {
            let code = match e {
                BridgeError::Device { .. } => ErrorCode::Unsupported,
                _ => ErrorCode::Malformed,
            };
            Refusal::new(code, format!("device pool {pool} on {device}: {e}"))
        };
        let cuda = if device.uuid == [0; 16] {
            Cuda::open(device.device)
        } else {
            Cuda::open_uuid(device.uuid)
        }
        .map_err(refuse)?;
        let len = spec.page_bytes.saturating_mul(u64::from(spec.pages));
        let region = DeviceRegion::open_ipc(&cuda, ipc_handle, offset, len).map_err(refuse)?;
        let pool = CudaPool::new(cuda, spec, epoch, region, states, DEVICE_STAGING_BYTES)
            .map_err(refuse)?;
        Ok(Arc::new(pool))
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = (epoch, states, ipc_handle, offset);
        Err(Refusal::new(
            ErrorCode::Unsupported,
            format!(
                "device pool {pool} on {device}: this daemon was built without the CUDA backend (the `cuda` feature); register a host pool, or run a daemon built with it"
            ),
        ))
    }
}

/// Page bytes a request moves: each page's group bytes within its layer range (`0..u32::MAX`:
/// every layer). Pages of unknown pools or groups count nothing (they fail on their own).
pub fn request_bytes(
    bridge: &Bridge,
    pages: impl Iterator<Item = (orbitkv_gpu_bridge::PageRef, u32, std::ops::Range<u32>)>,
) -> u64 {
    let mut total = 0u64;
    for (page, group, layers) in pages {
        let Ok(pool) = bridge.pool(page.pool) else {
            continue;
        };
        let Ok(geo) = pool.spec().group(group) else {
            continue;
        };
        let n = layers.end.min(geo.layers).saturating_sub(layers.start);
        total = total.saturating_add(u64::from(n) * geo.layer_bytes);
    }
    total
}

/// Copies each page's record (pinned under the lease) into the page: verified on the way out of
/// the store, fenced on the way into the page. Pages of a pool with staging memory (device
/// memory) go as one batch per pool, the store reading each record straight into the staging
/// buffer; the others page by page. Returns each page's status and the bytes copied.
pub fn load(
    store: &StateStore,
    bridge: &Bridge,
    epoch: u64,
    pins: &[(Located, Pin)],
    pages: &[LoadPage],
) -> (Vec<PageStatus>, u64) {
    let mut buf = Vec::new();
    let mut moved = 0u64;
    let by_block: HashMap<(u32, RankSpec, u32), Pin> = pins
        .iter()
        .map(|(l, pin)| ((l.group, l.rank, l.block), *pin))
        .collect();
    let mut statuses = Vec::with_capacity(pages.len());
    let mut staged: HashMap<PoolId, (Arc<dyn PagePool>, Vec<StagedPage>)> = HashMap::new();
    for (at, p) in pages.iter().enumerate() {
        let rank = RankSpec::from_code(p.rank);
        let Some(&pin) = by_block.get(&(p.group, rank, p.block)) else {
            statuses.push(PageStatus::Missing);
            continue;
        };
        // Fenced (epoch, pool, index, generation) and its geometry checked before any byte.
        // The page lease taken for the check ends here: it is taken again once the record is
        // read, so a read that stalls holds no page the engine may give up on and reuse.
        let checked = bridge
            .lease(epoch, p.page)
            .map_err(|e| status_of(&e))
            .and_then(|lease| Ok((span(&lease, p)?, lease.pool().clone())));
        let (span, pool) = match checked {
            Ok(x) => x,
            Err(status) => {
                statuses.push(status);
                continue;
            }
        };
        if pool.staged().is_some() {
            // Copied with the rest of its pool's pages below.
            let batch = &mut staged.entry(p.page.pool).or_insert((pool, Vec::new())).1;
            batch.push(StagedPage {
                at,
                pin,
                span,
                item: Item {
                    page: p.page,
                    group: p.group,
                    layers: p.layer_start..p.layer_end,
                },
            });
            statuses.push(PageStatus::Refused);
            continue;
        }
        // The DRAM tier's copy is lent as it is (one copy, into the page); a record read
        // from SSD comes through `buf`. A read or checksum failure drops the record: never
        // copied. A page reused during the read refuses the second lease.
        let copied = store.with_pinned(pin, &mut buf, |bytes| {
            if bytes.len() != span.record {
                return Err(PageStatus::BadGeometry);
            }
            let lease = PageLease::take(pool.clone(), p.page).map_err(|e| status_of(&e))?;
            bridge
                .load(
                    &lease,
                    p.group,
                    p.layer_start..p.layer_end,
                    &bytes[span.from..span.from + span.len],
                )
                .map_err(|e| status_of(&e))?;
            moved += span.len as u64;
            Ok(())
        });
        statuses.push(match copied {
            Ok(Some(Ok(()))) => PageStatus::Ok,
            Ok(Some(Err(status))) => status,
            Ok(None) => PageStatus::Missing,
            Err(_) => PageStatus::BadRecord,
        });
    }
    for (pool, batch) in staged.into_values() {
        moved += load_staged(store, &pool, batch, &mut statuses);
    }
    (statuses, moved)
}

/// Where a Load page's bytes lie in its record.
#[derive(Debug, Clone, Copy)]
struct Span {
    /// The record's length (all layers of the group, packed).
    record: usize,
    /// The first byte the page takes.
    from: usize,
    /// Bytes it takes.
    len: usize,
}

/// The part of its record a Load page takes, from the pool's geometry; the layer range must lie
/// in the group's.
fn span(lease: &PageLease, p: &LoadPage) -> Result<Span, PageStatus> {
    let geo = *lease
        .pool()
        .spec()
        .group(p.group)
        .map_err(|_| PageStatus::BadGeometry)?;
    // A placement with the layers inside its runs (SGLang page_first) takes whole pages only.
    if p.layer_start > p.layer_end
        || p.layer_end > geo.layers
        || !geo.addresses(&(p.layer_start..p.layer_end))
    {
        return Err(PageStatus::BadGeometry);
    }
    let bytes = |n: u64| usize::try_from(n).map_err(|_| PageStatus::BadGeometry);
    let from = bytes(u64::from(p.layer_start) * geo.layer_bytes)?;
    Ok(Span {
        record: bytes(geo.bytes_for(&geo.all_layers()))?,
        from,
        len: bytes(u64::from(p.layer_end) * geo.layer_bytes)? - from,
    })
}

/// A Load page bound for a pool with staging memory, fenced and checked.
struct StagedPage {
    /// Its position in the request.
    at: usize,
    pin: Pin,
    span: Span,
    item: Item,
}

/// Copies a pool's staged pages as one batch: the store reads each record straight into the
/// pool's staging memory; once a staging batch is read, each of its pages is leased (refused
/// if the engine reused it during the reads) until its copy has completed. A page whose record
/// is gone or fails verification is never copied (`Missing`); one the pool refuses gets its
/// fencing status; if the device fails, the pages not yet done stay `Refused`. Returns the
/// bytes copied.
fn load_staged(
    store: &StateStore,
    pool: &Arc<dyn PagePool>,
    batch: Vec<StagedPage>,
    statuses: &mut [PageStatus],
) -> u64 {
    let Some(staged) = pool.staged() else {
        return 0;
    };
    let items: Vec<Item> = batch.iter().map(|s| s.item.clone()).collect();
    let outcome: Vec<Cell<PageStatus>> = batch
        .iter()
        .map(|_| Cell::new(PageStatus::Refused))
        .collect();
    let leases: Vec<Cell<Option<PageLease>>> = batch.iter().map(|_| Cell::new(None)).collect();
    let rest: Vec<_> = batch.into_iter().map(|s| (s.at, s.pin, s.span)).collect();
    let mut moved = 0u64;
    let r = staged.load_staged(
        &items,
        &mut |i, dst| {
            let (_, pin, span) = rest[i];
            match store.read_pinned_into(pin, span.record, span.from, dst) {
                Ok(true) => true,
                Ok(false) => {
                    outcome[i].set(PageStatus::Missing);
                    false
                }
                Err(_) => {
                    outcome[i].set(PageStatus::BadRecord);
                    false
                }
            }
        },
        // Every read of the batch done: the page is leased (refused if the engine reused it
        // meanwhile) until its copy has completed.
        &mut |i| match PageLease::take(pool.clone(), items[i].page) {
            Ok(lease) => {
                leases[i].set(Some(lease));
                true
            }
            Err(e) => {
                outcome[i].set(status_of(&e));
                false
            }
        },
        &mut |i, r| {
            // Copied (or refused): the lease ends now, not when the whole batch has.
            if let Some(l) = leases.get(i) {
                l.take();
            }
            outcome[i].set(match r {
                Ok(()) => {
                    moved += rest[i].2.len as u64;
                    PageStatus::Ok
                }
                Err(e) => status_of(&e),
            });
        },
    );
    if let Err(e) = r {
        tracing::warn!(pool = %pool.spec().pool, "a staged Load stopped: {e}");
    }
    for ((at, _, _), o) in rest.iter().zip(&outcome) {
        statuses[*at] = o.get();
    }
    moved
}

/// Records of the Publishes waiting to be stored go to the store in bundles of at most this
/// many payload bytes (and at most half a segment), whichever publishers they come from: small
/// enough that the next bundle is encoded while the last one's write is in flight, and one sync
/// after the last makes them all durable.
pub const COMMIT_BUNDLE_BYTES: usize = 4 << 20;

/// Copy buffers a connection keeps between Publishes, so a copy lands in memory already
/// faulted in rather than in a fresh allocation (at most [`Spare::RETAIN`] bytes kept).
#[derive(Debug, Default)]
pub struct Spare {
    bufs: Vec<FrameBuf>,
    bytes: usize,
}

impl Spare {
    /// Bytes of buffers kept at most.
    pub const RETAIN: usize = 64 << 20;

    /// A kept buffer, if any.
    pub fn take(&mut self) -> Option<FrameBuf> {
        let b = self.bufs.pop()?;
        self.bytes -= b.capacity();
        Some(b)
    }

    /// Keeps `b` if its capacity fits under [`Spare::RETAIN`]; returns whether it did.
    pub fn give(&mut self, b: FrameBuf) -> bool {
        if self.bytes + b.capacity() > Self::RETAIN {
            return false;
        }
        self.bytes += b.capacity();
        self.bufs.push(b);
        true
    }
}

/// A Publish's pages copied out of the engine's pool: each page's status, and the records the
/// copied ones become, waiting to be stored.
#[derive(Debug)]
pub struct Copied {
    /// Per page, in request order: `Ok` when copied.
    pub statuses: Vec<PageStatus>,
    /// The copies: (request position, record, its frame).
    records: Vec<(usize, RecordMeta, FrameBuf)>,
    /// Buffers taken for pages that were not copied.
    unused: Vec<FrameBuf>,
}

impl Copied {
    /// Bytes copied out.
    pub fn bytes(&self) -> u64 {
        self.records
            .iter()
            .map(|(_, _, b)| b.payload().len() as u64)
            .sum()
    }

    /// Every buffer it holds, for the next Publish.
    pub fn into_buffers(self) -> Vec<FrameBuf> {
        let mut bufs = self.unused;
        bufs.extend(self.records.into_iter().map(|(_, _, b)| b));
        bufs.retain(|b| b.capacity() > 0);
        bufs
    }
}

/// Copies each page out (fenced, re-checked seqlock-style: a page reused during its copy is not
/// kept) into frames built in place for `store` ([`FrameBuf::begin`]: the store then writes
/// them, and keeps them in its DRAM tier, without copying), in buffers from `take`. The pages of
/// one pool are copied in one batched call (a device pool pipelines them through its staging
/// memory). Once this returns the engine may reuse every page: nothing reads them afterwards.
pub fn copy_out(
    bridge: &Bridge,
    session: &Session,
    store: &StateStore,
    pages: &[PublishPage],
    take: &mut dyn FnMut() -> FrameBuf,
) -> Copied {
    let inst: &Arc<crate::session::SealedInstance> = &session.instance;
    let alignment = store.frame_alignment();
    let mut statuses = vec![PageStatus::Ok; pages.len()];
    // Each page's position, record, lease and group, and a buffer for its frame.
    let mut leased = Vec::with_capacity(pages.len());
    for (i, p) in pages.iter().enumerate() {
        match lease_page(bridge, inst, session.rank, p) {
            Ok((meta, lease)) => leased.push((i, meta, lease, p.group, take())),
            Err(status) => statuses[i] = status,
        }
    }
    let copies = {
        let mut outs: Vec<CopyOut<'_>> = leased
            .iter_mut()
            .map(|(_, _, lease, group, buf)| {
                let expected = lease.pool().spec().group(*group).map_or(0, |g| {
                    usize::try_from(g.bytes_for(&g.all_layers())).unwrap_or(0)
                });
                CopyOut {
                    lease,
                    group: *group,
                    out: buf.begin(alignment, expected),
                }
            })
            .collect();
        bridge.publish_appending_many(&mut outs)
    };
    let mut records = Vec::with_capacity(leased.len());
    let mut unused = Vec::new();
    for ((i, meta, lease, _, mut buf), copied) in leased.into_iter().zip(copies) {
        drop(lease);
        // Its CRC32C; the fill to the alignment unit.
        let framed = copied
            .map_err(|e| status_of(&e))
            .and_then(|()| buf.finish(alignment).map_err(|_| PageStatus::BadGeometry));
        match framed {
            Ok(()) => records.push((i, meta, buf)),
            Err(status) => {
                statuses[i] = status;
                buf.clear();
                unused.push(buf);
            }
        }
    }
    Copied {
        statuses,
        records,
        unused,
    }
}

/// What storing a Publish's copies did.
#[derive(Debug)]
pub struct Stored {
    /// Each page's final status, in request order (`Ok`: stored; `Held`: waiting in DRAM for
    /// SSD admission).
    pub statuses: Vec<PageStatus>,
    /// Whether every stored record is durable already (the store syncs each put).
    pub durable: bool,
    /// The longest wait the store asked for before a `RetryLater` page is sent again.
    pub retry_after: std::time::Duration,
    /// Buffers its records no longer need, for the publisher's next copies.
    pub buffers: Vec<FrameBuf>,
}

impl Stored {
    /// Nothing stored yet of `copied`: the statuses of its copy.
    pub fn new(copied: &Copied) -> Self {
        Self {
            statuses: copied.statuses.clone(),
            durable: true,
            retry_after: std::time::Duration::ZERO,
            buffers: Vec::new(),
        }
    }

    /// Page `at`'s record was stored: written (durable once the store says so), or `held` in
    /// DRAM for SSD admission.
    fn stored(&mut self, at: usize, held: bool, durable: bool) {
        if held {
            self.statuses[at] = PageStatus::Held;
        } else {
            self.durable &= durable;
        }
    }

    fn refused(&mut self, at: usize, e: &orbitkv_store::Error) {
        self.statuses[at] = store_status(e);
        if let Retry::After(d) = e.retry() {
            self.retry_after = self.retry_after.max(d);
        }
    }

    /// The sync that was to make the stored records durable failed: none of them counts as
    /// stored (the store dropped the records written since its last good sync).
    pub fn sync_failed(&mut self, e: &orbitkv_store::Error) {
        for at in 0..self.statuses.len() {
            if self.statuses[at] == PageStatus::Ok {
                self.refused(at, e);
            }
        }
    }
}

/// Records of several Publishes, for one append.
pub struct Bundle {
    /// Each record: (publish, request position, record, frame), in arrival order.
    records: Vec<Waiting>,
    /// Their encoding, where the store does not write frames as built (compression), or why
    /// the store refused it.
    prepared: Option<orbitkv_store::Result<Prepared>>,
}

/// A record waiting to be stored: (publish, request position, record, frame).
pub type Waiting = (usize, usize, RecordMeta, FrameBuf);

impl Bundle {
    /// Its payload bytes.
    pub fn bytes(&self) -> usize {
        self.records.iter().map(|r| r.3.payload().len()).sum()
    }
}

/// Takes the records out of `publishes`, in arrival order; publish `j`'s are named `j`.
pub fn take_records(publishes: &mut [&mut Copied]) -> Vec<Waiting> {
    let mut out = Vec::new();
    for (j, c) in publishes.iter_mut().enumerate() {
        out.extend(
            std::mem::take(&mut c.records)
                .into_iter()
                .map(|(at, meta, b)| (j, at, meta, b)),
        );
    }
    out
}

/// Frames one bundle holds at most: one vectored write takes at most `IOV_MAX` buffers.
pub const BUNDLE_FRAMES: usize = 1024;

/// Puts `records` into bundles of at most [`COMMIT_BUNDLE_BYTES`] of payload (and half a
/// segment, and [`BUNDLE_FRAMES`] records) across publishers, each handed to `each` at once
/// (made ready by the calling thread: encoded where the store does not write frames as built,
/// their frames gathered into one write buffer where it writes them direct); stops when
/// `each` returns false.
pub fn bundle_records(
    store: &StateStore,
    records: Vec<Waiting>,
    each: &mut dyn FnMut(Bundle) -> bool,
) {
    // A bundle never makes a segment much larger than the store seals them at: the SSD tier
    // reclaims whole segments.
    let cap = usize::try_from(store.segment_bytes() / 2)
        .unwrap_or(usize::MAX)
        .clamp(1, COMMIT_BUNDLE_BYTES);
    let mut all = records.into_iter().peekable();
    while all.peek().is_some() {
        let mut records = Vec::new();
        let mut bytes = 0;
        while let Some(r) = all.next_if(|r| {
            records.is_empty()
                || (bytes + r.3.payload().len() <= cap && records.len() < BUNDLE_FRAMES)
        }) {
            bytes += r.3.payload().len();
            records.push(r);
        }
        let prepared = if store.takes_frames() {
            let frames: Vec<&FrameBuf> = records.iter().map(|r| &r.3).collect();
            store.gather(&frames).map(Ok)
        } else {
            let views: Vec<(RecordMeta, &[u8])> = records
                .iter()
                .map(|(_, _, m, b)| (m.clone(), b.payload()))
                .collect();
            Some(store.prepare(&views))
        };
        if !each(Bundle { records, prepared }) {
            return;
        }
    }
}

/// Appends `bundle` (one append; with a store that holds records back until a sync, the
/// caller's one sync then makes it durable), noting each record's outcome in `out`, indexed by
/// publish. When the store rejects the bundle for one of its records, they are stored one by
/// one, so only the rejected ones fail; a bundle refused for the store's sake (full,
/// read-only) fails whole, each page saying whether to publish it again. Buffers for the
/// publishers' next copies (the memory of copies the DRAM tier evicted, or the frames of
/// records not stored) go to their publishes' [`Stored::buffers`].
pub fn store_bundle(store: &StateStore, bundle: Bundle, out: &mut [Stored]) {
    let Bundle { records, prepared } = bundle;
    // Each record's (publish, request position), and the records for the store.
    let names: Vec<(usize, usize)> = records.iter().map(|(j, at, _, _)| (*j, *at)).collect();
    let mut frames: Vec<(RecordMeta, FrameBuf)> =
        records.into_iter().map(|(_, _, m, b)| (m, b)).collect();
    let result = match prepared {
        Some(Err(e)) => Err(e),
        Some(Ok(p)) => store.put_frames(&mut frames, Some(p)),
        None => store.put_frames(&mut frames, None),
    };
    match result {
        Ok(put) => {
            for (((j, at), m), held) in names.iter().zip(put.memory).zip(put.held) {
                out[*j].stored(*at, held, put.receipt.durable);
                out[*j].buffers.extend(m);
            }
        }
        // One record the store rejects (its range conflicts with a stored one, say) must not
        // take the others with it.
        Err(e) if e.retry() == Retry::Rejected && frames.len() == names.len() => {
            for ((j, at), record) in names.iter().zip(frames) {
                let mut one = vec![record];
                match store.put_frames(&mut one, None) {
                    Ok(put) => {
                        let held = put.held.first().is_some_and(|h| *h);
                        out[*j].stored(*at, held, put.receipt.durable);
                        out[*j].buffers.extend(put.memory.into_iter().flatten());
                    }
                    Err(e) => out[*j].refused(*at, &e),
                }
                out[*j].buffers.extend(one.into_iter().map(|(_, b)| b));
            }
        }
        Err(e) => {
            for (j, at) in &names {
                out[*j].refused(*at, &e);
            }
            // Frames the store did not take go back to their publishers.
            for ((j, _), (_, b)) in names.iter().zip(frames) {
                out[*j].buffers.push(b);
            }
        }
    }
}

/// Stores the copies of several Publishes together (see [`bundle_records`] and
/// [`store_bundle`]), on the calling thread; returns each Publish's outcome, in order.
pub fn store_copies(store: &StateStore, publishes: &mut [&mut Copied]) -> Vec<Stored> {
    let mut out: Vec<Stored> = publishes.iter().map(|c| Stored::new(c)).collect();
    bundle_records(store, take_records(publishes), &mut |b| {
        store_bundle(store, b, &mut out);
        true
    });
    out
}

/// Checks one page of a Publish against the instance's contract, names the record it becomes,
/// and leases the page.
fn lease_page(
    bridge: &Bridge,
    inst: &crate::session::SealedInstance,
    session_rank: u32,
    p: &PublishPage,
) -> Result<(RecordMeta, PageLease), PageStatus> {
    let contract = inst
        .contract
        .groups()
        .iter()
        .find(|c| c.group == CacheGroupId(p.group))
        .ok_or(PageStatus::BadGeometry)?;
    let rank = match (contract.ranks, RankSpec::from_code(p.rank)) {
        (Ranks::Replicated, RankSpec::Replicated) => RankSpec::Replicated,
        // A worker publishes its own shard only.
        (Ranks::Sharded(_), RankSpec::Rank(r)) if r == session_rank => RankSpec::Rank(r),
        _ => return Err(PageStatus::Rejected),
    };
    let slot = match rank {
        RankSpec::Replicated => 0,
        RankSpec::Rank(r) => r as usize,
    };
    let format = contract
        .formats
        .get(slot)
        .copied()
        .ok_or(PageStatus::BadGeometry)?;
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
        return Err(PageStatus::BadGeometry);
    };
    let parent = if p.parent.is_empty() {
        None
    } else {
        Some(key(&p.parent).map_err(|_| PageStatus::BadGeometry)?)
    };
    let lease = bridge
        .lease(inst.epoch, p.page)
        .map_err(|e| status_of(&e))?;
    let meta = RecordMeta {
        key: k,
        parent,
        range,
        format,
    };
    Ok((meta, lease))
}
