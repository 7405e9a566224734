//! Every message of protocol version 1, and its body encoding. Byte tables in `docs/protocol.md`
//! ("Messages"). Decoding checks every length against the bytes present and refuses trailing
//! bytes, unknown types and out-of-range enumerations with a typed error.

use orbitkv_gpu_bridge::{PageRef, PoolId};
use orbitkv_state::{HashDomain, Rule};

use super::error::{ProtocolError, Result};
use super::wire::{Reader, Writer};

/// A session token: issued when an instance seals, carried by every hot-path request.
pub type Token = [u8; 32];

/// Longest instance name, cache scope or client name, in bytes.
pub const MAX_NAME: usize = 256;
/// Longest engine-native block hash, in bytes.
pub const MAX_NATIVE_HASH: usize = 64;

/// Which part of an engine instance a session is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The scheduler: queries, acquires, releases.
    Scheduler,
    /// A worker rank: registers pools, loads, publishes.
    Worker,
}

/// A rank's registration. The instance seals once its scheduler and every declared worker have
/// registered and agree on identity, layout, scope and shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Register {
    /// The engine instance's name, shared by its scheduler and workers.
    pub instance: String,
    /// Scheduler or worker.
    pub role: Role,
    /// The worker's rank (0 for the scheduler).
    pub rank: u32,
    /// Worker ranks the instance declares.
    pub workers: u32,
    /// The computation identity digest.
    pub identity: [u8; 32],
    /// The model's name or directory, for operators (`inspect`); not part of the identity.
    pub model: String,
    /// Its hub revision or artifacts digest, for operators.
    pub revision: String,
    /// The engine's prefix-hash scheme.
    pub domain: HashDomain,
    /// The instance's storage layout, in its canonical encoding (docs/format.md).
    pub layout: Vec<u8>,
    /// The recovery rule of each cache group.
    pub rules: Vec<(u32, Rule)>,
    /// The cache scope; empty for none.
    pub scope: String,
    /// This rank's state format of each cache group, in the layout's group order, each in its
    /// canonical encoding (none for the scheduler).
    pub formats: Vec<Vec<u8>>,
    /// How long the daemon waits for the other ranks before refusing the seal.
    pub seal_timeout_ms: u32,
}

/// One cache group's chain of engine-native block hashes, block 0 first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupHashes {
    /// The cache group.
    pub group: u32,
    /// The native hash of each block, in order.
    pub hashes: Vec<Vec<u8>>,
}

/// A Query (no side effects) or an Acquire (the same, then pins under a lease).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueryRequest {
    /// The session token.
    pub token: Token,
    /// The session epoch.
    pub epoch: u64,
    /// First token the engine lacks (its valid prefix ends here).
    pub origin: u64,
    /// One past the last token the request could use.
    pub end: u64,
    /// The block hashes per cache group.
    pub groups: Vec<GroupHashes>,
}

/// The records to load for one group and rank: block indices into the query's hash list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProofLoad {
    /// The cache group.
    pub group: u32,
    /// The rank (`u32::MAX` for a replicated component).
    pub rank: u32,
    /// Block indices, in token order.
    pub blocks: Vec<u32>,
}

/// A proven restorable boundary and exactly what to load for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Proof {
    /// Tokens up to here can be restored.
    pub boundary: u64,
    /// What to load, per group and rank.
    pub loads: Vec<ProofLoad>,
}

/// One destination page of a Load.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoadPage {
    /// The block index (into the acquired query's hash list) whose record goes here.
    pub block: u32,
    /// The cache group.
    pub group: u32,
    /// The rank.
    pub rank: u32,
    /// The destination page.
    pub page: PageRef,
    /// First layer to copy.
    pub layer_start: u32,
    /// One past the last layer.
    pub layer_end: u32,
}

/// A Load: copy acquired records into pages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadRequest {
    /// The session token.
    pub token: Token,
    /// The session epoch.
    pub epoch: u64,
    /// The lease the records are pinned under.
    pub lease: u64,
    /// The pages to fill.
    pub pages: Vec<LoadPage>,
}

/// One source page of a Publish.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublishPage {
    /// The cache group.
    pub group: u32,
    /// The rank.
    pub rank: u32,
    /// The block's native hash.
    pub hash: Vec<u8>,
    /// The previous block's native hash (empty for the first block).
    pub parent: Vec<u8>,
    /// First token of the block.
    pub start: u64,
    /// One past its last token.
    pub end: u64,
    /// The source page.
    pub page: PageRef,
}

/// A Publish: copy pages out into the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublishRequest {
    /// The session token.
    pub token: Token,
    /// The session epoch.
    pub epoch: u64,
    /// The pages and what they hold.
    pub pages: Vec<PublishPage>,
}

/// What happened to one page of a Load or Publish.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PageStatus {
    /// Copied.
    Ok,
    /// The page's generation is not the one named.
    StaleGeneration,
    /// The request's epoch is not the pool's.
    StaleEpoch,
    /// The page index is out of range.
    OutOfRange,
    /// No such pool.
    UnknownPool,
    /// The page was reused during the copy; nothing stored.
    ChangedDuringCopy,
    /// The stored record failed verification; recompute.
    BadRecord,
    /// The record is not (or no longer) stored; recompute.
    Missing,
    /// The request does not fit the pool's geometry (layers, lengths).
    BadGeometry,
    /// Refused for good: the store takes no writes until an operator acts (read-only, a failed
    /// manifest checkpoint, ids exhausted), or the pool's memory or device failed. Stop sending
    /// this kind of request to this daemon (Publish) or pool.
    Refused,
    /// Not done now, may be done later: the disk or the SSD tier is full, a failed write sealed
    /// a segment off, the page's lease count is saturated. Send it again later.
    RetryLater,
    /// This record can never be stored as named (its token range conflicts with a stored
    /// record of its key, or it is too large); other pages are unaffected.
    Rejected,
}

impl PageStatus {
    const ALL: [PageStatus; 12] = [
        PageStatus::Ok,
        PageStatus::StaleGeneration,
        PageStatus::StaleEpoch,
        PageStatus::OutOfRange,
        PageStatus::UnknownPool,
        PageStatus::ChangedDuringCopy,
        PageStatus::BadRecord,
        PageStatus::Missing,
        PageStatus::BadGeometry,
        PageStatus::Refused,
        PageStatus::RetryLater,
        PageStatus::Rejected,
    ];

    /// The wire code.
    pub fn code(self) -> u16 {
        Self::ALL.iter().position(|s| *s == self).unwrap_or(0) as u16
    }

    /// The status of a wire code.
    pub fn from_code(code: u16) -> Result<Self> {
        Self::ALL
            .get(code as usize)
            .copied()
            .ok_or_else(|| ProtocolError::BadField {
                what: "page status",
                why: format!("unknown code {code}"),
            })
    }
}

/// Why a request was refused as a whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorCode {
    /// Not a message this daemon accepts (version, type, size, encoding).
    Malformed,
    /// The session token is unknown or forged.
    BadToken,
    /// The request's epoch is not the session's (the engine re-registered).
    StaleEpoch,
    /// The ranks disagree on a field; the detail names it.
    SealRefused,
    /// A declared rank did not register in time.
    SealTimeout,
    /// A per-client limit (leases, pins, bytes in flight) was reached.
    LimitExceeded,
    /// No such lease (released, expired, or another instance's).
    UnknownLease,
    /// The peer's credentials are not allowed.
    NotPermitted,
    /// Refused for good: the store takes no writes until an operator acts (read-only, a failed
    /// manifest checkpoint, ids exhausted, damage). Do not send it again to this daemon.
    Refused,
    /// Something failed inside the daemon.
    Internal,
    /// This daemon cannot do it here: a device pool on a daemon built without the CUDA
    /// backend, or on a machine without the driver or the device. The detail says which.
    Unsupported,
    /// Not done now, may be done later (the disk or SSD tier full, a failed write, a proven
    /// record that left the store before it was pinned): send it again after the error's
    /// retry-after.
    RetryLater,
    /// The request names a namespace this store does not hold.
    UnknownNamespace,
}

impl ErrorCode {
    const ALL: [ErrorCode; 13] = [
        ErrorCode::Malformed,
        ErrorCode::BadToken,
        ErrorCode::StaleEpoch,
        ErrorCode::SealRefused,
        ErrorCode::SealTimeout,
        ErrorCode::LimitExceeded,
        ErrorCode::UnknownLease,
        ErrorCode::NotPermitted,
        ErrorCode::Refused,
        ErrorCode::Internal,
        ErrorCode::Unsupported,
        ErrorCode::RetryLater,
        ErrorCode::UnknownNamespace,
    ];

    /// The wire code (from 1).
    pub fn code(self) -> u16 {
        Self::ALL.iter().position(|s| *s == self).unwrap_or(0) as u16 + 1
    }

    /// The error of a wire code.
    pub fn from_code(code: u16) -> Result<Self> {
        code.checked_sub(1)
            .and_then(|i| Self::ALL.get(i as usize))
            .copied()
            .ok_or_else(|| ProtocolError::BadField {
                what: "error code",
                why: format!("unknown code {code}"),
            })
    }
}

/// A message of protocol version 1.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    /// Opens a connection: the client's name and process id.
    Hello {
        /// The client's name.
        client: String,
        /// Its process id.
        pid: u32,
    },
    /// A rank registers; answered by [`Message::Sealed`] once the instance seals, or an error.
    Register(Register),
    /// A worker registers a page pool; the pool's descriptor travels with the frame (a host
    /// pool's region, or a device pool's state words).
    RegisterPool {
        /// The session token.
        token: Token,
        /// The pool's registration.
        spec: orbitkv_gpu_bridge::PoolSpec,
        /// Where its pages are.
        memory: orbitkv_gpu_bridge::PageMemory,
    },
    /// The longest proven restorable boundary, without side effects.
    Query(QueryRequest),
    /// As a query, then pins the proven records under a lease.
    Acquire(QueryRequest),
    /// Copies acquired records into pages.
    Load(LoadRequest),
    /// Copies pages out into the store.
    Publish(PublishRequest),
    /// Ends a lease.
    Release {
        /// The session token.
        token: Token,
        /// The lease.
        lease: u64,
    },
    /// Asks for the daemon's metrics.
    Stats,
    /// Retires a namespace (watermark semantics, docs/format.md).
    Retire {
        /// The namespace.
        namespace: [u8; 32],
    },
    /// Makes every accepted publish durable.
    Sync,
    /// Answers Hello.
    Welcome {
        /// The daemon's version.
        server: String,
        /// Its limit on message bodies.
        max_body: u32,
    },
    /// The instance sealed.
    Sealed {
        /// This rank's session id.
        session: u64,
        /// The instance's epoch.
        epoch: u64,
        /// The instance's namespace.
        namespace: [u8; 32],
        /// The session token for hot-path requests.
        token: Token,
    },
    /// The pool is registered.
    PoolRegistered {
        /// The pool.
        pool: PoolId,
    },
    /// A proven boundary.
    Proof(Proof),
    /// Nothing beyond the origin can be restored, and why.
    Miss {
        /// The reason's code (the validator's recompute reasons, docs/protocol.md).
        reason: u16,
        /// A readable account.
        detail: String,
    },
    /// The proven records are pinned.
    Leased {
        /// The lease.
        lease: u64,
        /// It ends this long after the last use unless released.
        ttl_ms: u32,
        /// What was proven and pinned.
        proof: Proof,
    },
    /// A Load finished: one status per page, in request order.
    Loaded {
        /// Per page.
        pages: Vec<PageStatus>,
    },
    /// A Publish's copies are done: the engine may reuse the pages; one status per page.
    PublishCopied {
        /// Per page.
        pages: Vec<PageStatus>,
    },
    /// A Publish's records are stored and durable (a second reply to the same request): one
    /// final status per page — `Ok` for each stored record, else why its page was not stored.
    PublishDurable {
        /// Per page.
        pages: Vec<PageStatus>,
        /// For pages with status [`PageStatus::RetryLater`], the wait in milliseconds the store
        /// asks for before they are sent again (0: at once, or no such page).
        retry_after_ms: u32,
    },
    /// The lease ended.
    Released,
    /// The metrics, in Prometheus text format.
    StatsReply {
        /// The text.
        text: String,
    },
    /// The namespace is retired below this sequence.
    Retired {
        /// The watermark.
        watermark: u64,
    },
    /// Everything accepted is durable.
    Synced,
    /// The request was refused.
    Error {
        /// Why.
        code: ErrorCode,
        /// For [`ErrorCode::RetryLater`], the wait in milliseconds before sending it again;
        /// 0 for every other code.
        retry_after_ms: u32,
        /// A readable account.
        detail: String,
    },
}

/// Message type codes.
pub mod kind {
    #![allow(
        missing_docs,
        reason = "each constant is the code of the message it names"
    )]
    pub const HELLO: u16 = 0x0101;
    pub const REGISTER: u16 = 0x0102;
    pub const REGISTER_POOL: u16 = 0x0103;
    pub const QUERY: u16 = 0x0110;
    pub const ACQUIRE: u16 = 0x0111;
    pub const LOAD: u16 = 0x0112;
    pub const PUBLISH: u16 = 0x0113;
    pub const RELEASE: u16 = 0x0114;
    pub const STATS: u16 = 0x0120;
    pub const RETIRE: u16 = 0x0121;
    pub const SYNC: u16 = 0x0122;
    pub const WELCOME: u16 = 0x0201;
    pub const SEALED: u16 = 0x0202;
    pub const POOL_REGISTERED: u16 = 0x0203;
    pub const PROOF: u16 = 0x0210;
    pub const MISS: u16 = 0x0211;
    pub const LEASED: u16 = 0x0212;
    pub const LOADED: u16 = 0x0213;
    pub const PUBLISH_COPIED: u16 = 0x0214;
    pub const PUBLISH_DURABLE: u16 = 0x0215;
    pub const RELEASED: u16 = 0x0216;
    pub const STATS_REPLY: u16 = 0x0220;
    pub const RETIRED: u16 = 0x0221;
    pub const SYNCED: u16 = 0x0222;
    pub const ERROR: u16 = 0x02ff;
}

fn name(w: &mut Writer, s: &str) {
    w.bytes16(s.as_bytes());
}

fn read_name(r: &mut Reader<'_>, what: &'static str) -> Result<String> {
    let s = r.text16(what)?;
    if s.len() > MAX_NAME {
        return Err(ProtocolError::BadField {
            what,
            why: format!("{} bytes, at most {MAX_NAME}", s.len()),
        });
    }
    Ok(s)
}

fn read_hash(r: &mut Reader<'_>, what: &'static str, empty_ok: bool) -> Result<Vec<u8>> {
    let h = r.bytes8(what)?;
    if h.len() > MAX_NATIVE_HASH || (h.is_empty() && !empty_ok) {
        return Err(ProtocolError::BadField {
            what,
            why: format!("a native hash of {} bytes", h.len()),
        });
    }
    Ok(h.to_vec())
}

fn page_ref(w: &mut Writer, p: &PageRef) {
    w.u32(p.pool.0).u32(p.index).u64(p.generation);
}

fn read_page_ref(r: &mut Reader<'_>) -> Result<PageRef> {
    Ok(PageRef {
        pool: PoolId(r.u32("page pool")?),
        index: r.u32("page index")?,
        generation: r.u64("page generation")?,
    })
}

fn query(w: &mut Writer, q: &QueryRequest) {
    w.raw(&q.token).u64(q.epoch).u64(q.origin).u64(q.end);
    w.u32(q.groups.len() as u32);
    for g in &q.groups {
        w.u32(g.group).u32(g.hashes.len() as u32);
        for h in &g.hashes {
            w.bytes8(h);
        }
    }
}

fn read_query(r: &mut Reader<'_>) -> Result<QueryRequest> {
    let token = r.array("token")?;
    let epoch = r.u64("epoch")?;
    let origin = r.u64("origin")?;
    let end = r.u64("end")?;
    if end < origin {
        return Err(ProtocolError::BadField {
            what: "query range",
            why: format!("end {end} before origin {origin}"),
        });
    }
    let n = r.count("groups", 8)?;
    let mut groups = Vec::with_capacity(n);
    for _ in 0..n {
        let group = r.u32("group")?;
        let k = r.count("block hashes", 2)?;
        let mut hashes = Vec::with_capacity(k);
        for _ in 0..k {
            hashes.push(read_hash(r, "block hash", false)?);
        }
        groups.push(GroupHashes { group, hashes });
    }
    Ok(QueryRequest {
        token,
        epoch,
        origin,
        end,
        groups,
    })
}

fn proof(w: &mut Writer, p: &Proof) {
    w.u64(p.boundary).u32(p.loads.len() as u32);
    for l in &p.loads {
        w.u32(l.group).u32(l.rank).u32(l.blocks.len() as u32);
        for b in &l.blocks {
            w.u32(*b);
        }
    }
}

fn read_proof(r: &mut Reader<'_>) -> Result<Proof> {
    let boundary = r.u64("boundary")?;
    let n = r.count("loads", 12)?;
    let mut loads = Vec::with_capacity(n);
    for _ in 0..n {
        let group = r.u32("group")?;
        let rank = r.u32("rank")?;
        let k = r.count("blocks", 4)?;
        let mut blocks = Vec::with_capacity(k);
        for _ in 0..k {
            blocks.push(r.u32("block")?);
        }
        loads.push(ProofLoad {
            group,
            rank,
            blocks,
        });
    }
    Ok(Proof { boundary, loads })
}

fn statuses(w: &mut Writer, s: &[PageStatus]) {
    w.u32(s.len() as u32);
    for x in s {
        w.u16(x.code());
    }
}

fn read_statuses(r: &mut Reader<'_>) -> Result<Vec<PageStatus>> {
    let n = r.count("page statuses", 2)?;
    (0..n)
        .map(|_| PageStatus::from_code(r.u16("page status")?))
        .collect()
}

fn pool_spec(w: &mut Writer, s: &orbitkv_gpu_bridge::PoolSpec) {
    w.u32(s.pool.0)
        .u64(s.page_bytes)
        .u32(s.pages)
        .u32(s.groups.len() as u32);
    for g in &s.groups {
        w.u32(g.group)
            .u32(g.layers)
            .u64(g.offset)
            .u64(g.layer_stride)
            .u64(g.layer_bytes);
    }
}

fn page_memory(w: &mut Writer, m: &orbitkv_gpu_bridge::PageMemory) {
    match m {
        orbitkv_gpu_bridge::PageMemory::Host => {
            w.u8(0);
        }
        orbitkv_gpu_bridge::PageMemory::Device {
            device,
            ipc_handle,
            offset,
        } => {
            w.u8(1)
                .u32(u32::from_le_bytes(device.to_le_bytes()))
                .raw(ipc_handle)
                .u64(*offset);
        }
    }
}

fn read_page_memory(r: &mut Reader<'_>) -> Result<orbitkv_gpu_bridge::PageMemory> {
    match r.u8("page memory")? {
        0 => Ok(orbitkv_gpu_bridge::PageMemory::Host),
        1 => Ok(orbitkv_gpu_bridge::PageMemory::Device {
            device: i32::from_le_bytes(r.u32("device")?.to_le_bytes()),
            ipc_handle: r.array("IPC handle")?,
            offset: r.u64("offset in the allocation")?,
        }),
        other => Err(ProtocolError::BadField {
            what: "page memory",
            why: format!("unknown kind {other}"),
        }),
    }
}

fn read_pool_spec(r: &mut Reader<'_>) -> Result<orbitkv_gpu_bridge::PoolSpec> {
    let pool = PoolId(r.u32("pool")?);
    let page_bytes = r.u64("page size")?;
    let pages = r.u32("page count")?;
    let n = r.count("cache groups", 32)?;
    let mut groups = Vec::with_capacity(n);
    for _ in 0..n {
        groups.push(orbitkv_gpu_bridge::GroupGeometry {
            group: r.u32("group")?,
            layers: r.u32("layers")?,
            offset: r.u64("layer offset")?,
            layer_stride: r.u64("layer stride")?,
            layer_bytes: r.u64("layer size")?,
        });
    }
    Ok(orbitkv_gpu_bridge::PoolSpec {
        pool,
        page_bytes,
        pages,
        groups,
    })
}

impl Message {
    /// The message's type code.
    pub fn kind(&self) -> u16 {
        match self {
            Message::Hello { .. } => kind::HELLO,
            Message::Register(_) => kind::REGISTER,
            Message::RegisterPool { .. } => kind::REGISTER_POOL,
            Message::Query(_) => kind::QUERY,
            Message::Acquire(_) => kind::ACQUIRE,
            Message::Load(_) => kind::LOAD,
            Message::Publish(_) => kind::PUBLISH,
            Message::Release { .. } => kind::RELEASE,
            Message::Stats => kind::STATS,
            Message::Retire { .. } => kind::RETIRE,
            Message::Sync => kind::SYNC,
            Message::Welcome { .. } => kind::WELCOME,
            Message::Sealed { .. } => kind::SEALED,
            Message::PoolRegistered { .. } => kind::POOL_REGISTERED,
            Message::Proof(_) => kind::PROOF,
            Message::Miss { .. } => kind::MISS,
            Message::Leased { .. } => kind::LEASED,
            Message::Loaded { .. } => kind::LOADED,
            Message::PublishCopied { .. } => kind::PUBLISH_COPIED,
            Message::PublishDurable { .. } => kind::PUBLISH_DURABLE,
            Message::Released => kind::RELEASED,
            Message::StatsReply { .. } => kind::STATS_REPLY,
            Message::Retired { .. } => kind::RETIRED,
            Message::Synced => kind::SYNCED,
            Message::Error { .. } => kind::ERROR,
        }
    }

    /// Encodes the body.
    pub fn encode_body(&self) -> Vec<u8> {
        let mut w = Writer::new();
        match self {
            Message::Hello { client, pid } => {
                name(&mut w, client);
                w.u32(*pid);
            }
            Message::Register(g) => {
                name(&mut w, &g.instance);
                w.u8(match g.role {
                    Role::Scheduler => 0,
                    Role::Worker => 1,
                })
                .u32(g.rank)
                .u32(g.workers)
                .raw(&g.identity);
                name(&mut w, &g.model);
                name(&mut w, &g.revision);
                w.u8(g.domain.code())
                    .bytes32(&g.layout)
                    .u32(g.rules.len() as u32);
                for (group, rule) in &g.rules {
                    let (k, param) = match rule {
                        Rule::Prefix => (0, 0),
                        Rule::Window { tokens } => (1, *tokens),
                        Rule::Checkpoint { grid } => (2, *grid),
                        Rule::Undefined => (3, 0),
                    };
                    w.u32(*group).u8(k).u64(param);
                }
                name(&mut w, &g.scope);
                w.u32(g.formats.len() as u32);
                for f in &g.formats {
                    w.bytes32(f);
                }
                w.u32(g.seal_timeout_ms);
            }
            Message::RegisterPool {
                token,
                spec,
                memory,
            } => {
                w.raw(token);
                pool_spec(&mut w, spec);
                page_memory(&mut w, memory);
            }
            Message::Query(q) | Message::Acquire(q) => query(&mut w, q),
            Message::Load(l) => {
                w.raw(&l.token)
                    .u64(l.epoch)
                    .u64(l.lease)
                    .u32(l.pages.len() as u32);
                for p in &l.pages {
                    w.u32(p.block).u32(p.group).u32(p.rank);
                    page_ref(&mut w, &p.page);
                    w.u32(p.layer_start).u32(p.layer_end);
                }
            }
            Message::Publish(p) => {
                w.raw(&p.token).u64(p.epoch).u32(p.pages.len() as u32);
                for x in &p.pages {
                    w.u32(x.group)
                        .u32(x.rank)
                        .bytes8(&x.hash)
                        .bytes8(&x.parent)
                        .u64(x.start)
                        .u64(x.end);
                    page_ref(&mut w, &x.page);
                }
            }
            Message::Release { token, lease } => {
                w.raw(token).u64(*lease);
            }
            Message::Stats | Message::Sync | Message::Released => {}
            Message::Synced => {}
            Message::Retire { namespace } => {
                w.raw(namespace);
            }
            Message::Welcome { server, max_body } => {
                name(&mut w, server);
                w.u32(*max_body);
            }
            Message::Sealed {
                session,
                epoch,
                namespace,
                token,
            } => {
                w.u64(*session).u64(*epoch).raw(namespace).raw(token);
            }
            Message::PoolRegistered { pool } => {
                w.u32(pool.0);
            }
            Message::Proof(p) => proof(&mut w, p),
            Message::Miss { reason, detail } => {
                w.u16(*reason).bytes16(detail.as_bytes());
            }
            Message::Leased {
                lease,
                ttl_ms,
                proof: p,
            } => {
                w.u64(*lease).u32(*ttl_ms);
                proof(&mut w, p);
            }
            Message::Loaded { pages } | Message::PublishCopied { pages } => {
                statuses(&mut w, pages);
            }
            Message::PublishDurable {
                pages,
                retry_after_ms,
            } => {
                statuses(&mut w, pages);
                w.u32(*retry_after_ms);
            }
            Message::StatsReply { text } => {
                w.bytes32(text.as_bytes());
            }
            Message::Retired { watermark } => {
                w.u64(*watermark);
            }
            Message::Error {
                code,
                retry_after_ms,
                detail,
            } => {
                w.u16(code.code())
                    .u32(*retry_after_ms)
                    .bytes16(detail.as_bytes());
            }
        }
        w.into_bytes()
    }

    /// Decodes a body of type `kind`.
    pub fn decode(kind: u16, body: &[u8]) -> Result<Self> {
        let mut r = Reader::new(body);
        let r = &mut r;
        let m = match kind {
            kind::HELLO => Message::Hello {
                client: read_name(r, "client name")?,
                pid: r.u32("pid")?,
            },
            kind::REGISTER => {
                let instance = read_name(r, "instance")?;
                if instance.is_empty() {
                    return Err(ProtocolError::BadField {
                        what: "instance",
                        why: "empty".into(),
                    });
                }
                let role = match r.u8("role")? {
                    0 => Role::Scheduler,
                    1 => Role::Worker,
                    x => {
                        return Err(ProtocolError::BadField {
                            what: "role",
                            why: format!("unknown role {x}"),
                        });
                    }
                };
                let rank = r.u32("rank")?;
                let workers = r.u32("workers")?;
                let identity = r.array("identity")?;
                let model = read_name(r, "model")?;
                let revision = read_name(r, "revision")?;
                let domain = HashDomain::from_code(r.u8("hash domain")?).map_err(|e| {
                    ProtocolError::BadField {
                        what: "hash domain",
                        why: e.to_string(),
                    }
                })?;
                let layout = r.bytes32("layout")?.to_vec();
                let n = r.count("rules", 13)?;
                let mut rules = Vec::with_capacity(n);
                for _ in 0..n {
                    let group = r.u32("rule group")?;
                    let k = r.u8("rule")?;
                    let param = r.u64("rule parameter")?;
                    let rule = match k {
                        0 => Rule::Prefix,
                        1 => Rule::Window { tokens: param },
                        2 => Rule::Checkpoint { grid: param },
                        3 => Rule::Undefined,
                        x => {
                            return Err(ProtocolError::BadField {
                                what: "rule",
                                why: format!("unknown rule {x}"),
                            });
                        }
                    };
                    if matches!(rule, Rule::Prefix | Rule::Undefined) && param != 0 {
                        return Err(ProtocolError::BadField {
                            what: "rule parameter",
                            why: "nonzero for a rule without one".into(),
                        });
                    }
                    rules.push((group, rule));
                }
                Message::Register(Register {
                    instance,
                    role,
                    rank,
                    workers,
                    identity,
                    model,
                    revision,
                    domain,
                    layout,
                    rules,
                    scope: read_name(r, "scope")?,
                    formats: {
                        let n = r.count("formats", 4)?;
                        let mut v = Vec::with_capacity(n);
                        for _ in 0..n {
                            v.push(r.bytes32("format")?.to_vec());
                        }
                        v
                    },
                    seal_timeout_ms: r.u32("seal timeout")?,
                })
            }
            kind::REGISTER_POOL => Message::RegisterPool {
                token: r.array("token")?,
                spec: read_pool_spec(r)?,
                memory: read_page_memory(r)?,
            },
            kind::QUERY => Message::Query(read_query(r)?),
            kind::ACQUIRE => Message::Acquire(read_query(r)?),
            kind::LOAD => {
                let token = r.array("token")?;
                let epoch = r.u64("epoch")?;
                let lease = r.u64("lease")?;
                let n = r.count("load pages", 36)?;
                let mut pages = Vec::with_capacity(n);
                for _ in 0..n {
                    let block = r.u32("block")?;
                    let group = r.u32("group")?;
                    let rank = r.u32("rank")?;
                    let page = read_page_ref(r)?;
                    let layer_start = r.u32("first layer")?;
                    let layer_end = r.u32("layer end")?;
                    if layer_end < layer_start {
                        return Err(ProtocolError::BadField {
                            what: "layers",
                            why: format!("{layer_start}..{layer_end}"),
                        });
                    }
                    pages.push(LoadPage {
                        block,
                        group,
                        rank,
                        page,
                        layer_start,
                        layer_end,
                    });
                }
                Message::Load(LoadRequest {
                    token,
                    epoch,
                    lease,
                    pages,
                })
            }
            kind::PUBLISH => {
                let token = r.array("token")?;
                let epoch = r.u64("epoch")?;
                let n = r.count("publish pages", 42)?;
                let mut pages = Vec::with_capacity(n);
                for _ in 0..n {
                    let group = r.u32("group")?;
                    let rank = r.u32("rank")?;
                    let hash = read_hash(r, "block hash", false)?;
                    let parent = read_hash(r, "parent hash", true)?;
                    let start = r.u64("block start")?;
                    let end = r.u64("block end")?;
                    if end <= start {
                        return Err(ProtocolError::BadField {
                            what: "block range",
                            why: format!("{start}..{end}"),
                        });
                    }
                    pages.push(PublishPage {
                        group,
                        rank,
                        hash,
                        parent,
                        start,
                        end,
                        page: read_page_ref(r)?,
                    });
                }
                Message::Publish(PublishRequest {
                    token,
                    epoch,
                    pages,
                })
            }
            kind::RELEASE => Message::Release {
                token: r.array("token")?,
                lease: r.u64("lease")?,
            },
            kind::STATS => Message::Stats,
            kind::RETIRE => Message::Retire {
                namespace: r.array("namespace")?,
            },
            kind::SYNC => Message::Sync,
            kind::WELCOME => Message::Welcome {
                server: read_name(r, "server")?,
                max_body: r.u32("max body")?,
            },
            kind::SEALED => Message::Sealed {
                session: r.u64("session")?,
                epoch: r.u64("epoch")?,
                namespace: r.array("namespace")?,
                token: r.array("token")?,
            },
            kind::POOL_REGISTERED => Message::PoolRegistered {
                pool: PoolId(r.u32("pool")?),
            },
            kind::PROOF => Message::Proof(read_proof(r)?),
            kind::MISS => Message::Miss {
                reason: r.u16("miss reason")?,
                detail: r.text16("detail")?,
            },
            kind::LEASED => Message::Leased {
                lease: r.u64("lease")?,
                ttl_ms: r.u32("ttl")?,
                proof: read_proof(r)?,
            },
            kind::LOADED => Message::Loaded {
                pages: read_statuses(r)?,
            },
            kind::PUBLISH_COPIED => Message::PublishCopied {
                pages: read_statuses(r)?,
            },
            kind::PUBLISH_DURABLE => Message::PublishDurable {
                pages: read_statuses(r)?,
                retry_after_ms: r.u32("retry after")?,
            },
            kind::RELEASED => Message::Released,
            kind::STATS_REPLY => {
                let b = r.bytes32("stats")?;
                Message::StatsReply {
                    text: String::from_utf8(b.to_vec()).map_err(|_| ProtocolError::BadField {
                        what: "stats",
                        why: "not UTF-8".into(),
                    })?,
                }
            }
            kind::RETIRED => Message::Retired {
                watermark: r.u64("watermark")?,
            },
            kind::SYNCED => Message::Synced,
            kind::ERROR => Message::Error {
                code: ErrorCode::from_code(r.u16("error code")?)?,
                retry_after_ms: r.u32("retry after")?,
                detail: r.text16("detail")?,
            },
            other => return Err(ProtocolError::UnknownType(other)),
        };
        r.finish("message")?;
        Ok(m)
    }

    /// The whole frame for this message under request id `request`.
    pub fn encode_frame(&self, request: u64) -> Result<Vec<u8>> {
        super::frame::encode_frame(self.kind(), request, &self.encode_body())
    }
}
