//! Every message of protocol version 2, and its body encoding. Byte tables are in
//! `docs/protocol.md` ("Messages").
//!
//! Each body's encode and decode sit beside its definition, grouped by role: `session`,
//! `pools`, `query`, `transfer`, `admin`, `errors`.
//! [`Message`] dispatches over the kind table, [`KINDS`].
//! Decoding checks every length against the bytes present.
//! It refuses trailing bytes, unknown types and out-of-range enumerations with a typed error.

mod admin;
mod errors;
mod fields;
mod pools;
mod query;
mod session;
mod transfer;

pub use errors::ErrorCode;
pub use query::{GroupHashes, Proof, ProofLoad, QueryRequest};
pub use session::{Register, Role};
pub use transfer::{LoadPage, LoadRequest, PageStatus, PublishPage, PublishRequest};

use orbitkv_gpu_bridge::PoolId;

use crate::error::{ProtocolError, Result};
use crate::wire::{Reader, Writer};

/// A session token: issued when an instance seals, carried by every hot-path request.
pub type Token = [u8; 32];

/// Longest instance name, cache scope or client name, in bytes.
pub const MAX_NAME: usize = 256;
/// Longest engine-native block hash, in bytes.
pub const MAX_NATIVE_HASH: usize = 64;
/// Most block hashes one Query or Acquire names, over all its groups: 2^20, a million tokens of
/// one-token pages. Each decoded hash is its own allocation, so the count, not the frame's bytes,
/// bounds the memory a query takes.
pub const MAX_QUERY_BLOCKS: usize = 1 << 20;
/// Most cache groups one Query or Acquire names (a layout's limit).
pub const MAX_QUERY_GROUPS: usize = orbitkv_state::layout::MAX_GROUPS;

/// A body (or a part of one) with its wire encoding.
pub trait Body: Sized {
    /// Appends the encoding to `w`.
    fn encode(&self, w: &mut Writer);
    /// Reads one from `r`; the caller checks that nothing is left over.
    fn decode(r: &mut Reader<'_>) -> Result<Self>;
}

/// A message of protocol version 2 ([`crate::frame::VERSION`]).
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
    /// A worker ends a pool's registration; answered once the daemon has let go of its memory
    /// (no copy touches it, its mapping is closed), so the engine may free it.
    UnregisterPool {
        /// The session token.
        token: Token,
        /// The pool.
        pool: PoolId,
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
    /// The pool's registration ended and the daemon let go of its memory.
    PoolUnregistered {
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
    pub const UNREGISTER_POOL: u16 = 0x0104;
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
    pub const POOL_UNREGISTERED: u16 = 0x0204;
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

/// One message type: its code, its name in `docs/protocol.md`, and its body's decoder.
#[derive(Clone, Copy)]
pub struct Kind {
    /// The type code.
    pub code: u16,
    /// The message's name.
    pub name: &'static str,
    decode: fn(&mut Reader<'_>) -> Result<Message>,
}

impl std::fmt::Debug for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({:#06x})", self.name, self.code)
    }
}

/// Every message type of version 1: what [`Message::decode`] dispatches over.
pub const KINDS: [Kind; 27] = [
    Kind {
        code: kind::HELLO,
        name: "Hello",
        decode: session::decode_hello,
    },
    Kind {
        code: kind::REGISTER,
        name: "Register",
        decode: |r| Ok(Message::Register(Register::decode(r)?)),
    },
    Kind {
        code: kind::REGISTER_POOL,
        name: "RegisterPool",
        decode: pools::decode_register_pool,
    },
    Kind {
        code: kind::UNREGISTER_POOL,
        name: "UnregisterPool",
        decode: pools::decode_unregister_pool,
    },
    Kind {
        code: kind::QUERY,
        name: "Query",
        decode: |r| Ok(Message::Query(QueryRequest::decode(r)?)),
    },
    Kind {
        code: kind::ACQUIRE,
        name: "Acquire",
        decode: |r| Ok(Message::Acquire(QueryRequest::decode(r)?)),
    },
    Kind {
        code: kind::LOAD,
        name: "Load",
        decode: |r| Ok(Message::Load(LoadRequest::decode(r)?)),
    },
    Kind {
        code: kind::PUBLISH,
        name: "Publish",
        decode: |r| Ok(Message::Publish(PublishRequest::decode(r)?)),
    },
    Kind {
        code: kind::RELEASE,
        name: "Release",
        decode: query::decode_release,
    },
    Kind {
        code: kind::STATS,
        name: "Stats",
        decode: |_| Ok(Message::Stats),
    },
    Kind {
        code: kind::RETIRE,
        name: "Retire",
        decode: admin::decode_retire,
    },
    Kind {
        code: kind::SYNC,
        name: "Sync",
        decode: |_| Ok(Message::Sync),
    },
    Kind {
        code: kind::WELCOME,
        name: "Welcome",
        decode: session::decode_welcome,
    },
    Kind {
        code: kind::SEALED,
        name: "Sealed",
        decode: session::decode_sealed,
    },
    Kind {
        code: kind::POOL_REGISTERED,
        name: "PoolRegistered",
        decode: pools::decode_pool_registered,
    },
    Kind {
        code: kind::POOL_UNREGISTERED,
        name: "PoolUnregistered",
        decode: |r| {
            Ok(Message::PoolUnregistered {
                pool: PoolId(r.u32("pool")?),
            })
        },
    },
    Kind {
        code: kind::PROOF,
        name: "Proof",
        decode: |r| Ok(Message::Proof(Proof::decode(r)?)),
    },
    Kind {
        code: kind::MISS,
        name: "Miss",
        decode: query::decode_miss,
    },
    Kind {
        code: kind::LEASED,
        name: "Leased",
        decode: query::decode_leased,
    },
    Kind {
        code: kind::LOADED,
        name: "Loaded",
        decode: |r| {
            Ok(Message::Loaded {
                pages: transfer::decode_statuses(r)?,
            })
        },
    },
    Kind {
        code: kind::PUBLISH_COPIED,
        name: "PublishCopied",
        decode: |r| {
            Ok(Message::PublishCopied {
                pages: transfer::decode_statuses(r)?,
            })
        },
    },
    Kind {
        code: kind::PUBLISH_DURABLE,
        name: "PublishDurable",
        decode: transfer::decode_publish_durable,
    },
    Kind {
        code: kind::RELEASED,
        name: "Released",
        decode: |_| Ok(Message::Released),
    },
    Kind {
        code: kind::STATS_REPLY,
        name: "StatsReply",
        decode: admin::decode_stats_reply,
    },
    Kind {
        code: kind::RETIRED,
        name: "Retired",
        decode: admin::decode_retired,
    },
    Kind {
        code: kind::SYNCED,
        name: "Synced",
        decode: |_| Ok(Message::Synced),
    },
    Kind {
        code: kind::ERROR,
        name: "Error",
        decode: errors::decode_error,
    },
];

impl Message {
    /// The message's type code.
    pub fn kind(&self) -> u16 {
        match self {
            Message::Hello { .. } => kind::HELLO,
            Message::Register(_) => kind::REGISTER,
            Message::RegisterPool { .. } => kind::REGISTER_POOL,
            Message::UnregisterPool { .. } => kind::UNREGISTER_POOL,
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
            Message::PoolUnregistered { .. } => kind::POOL_UNREGISTERED,
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
        let w_ = &mut w;
        match self {
            Message::Hello { client, pid } => session::encode_hello(w_, client, *pid),
            Message::Register(g) => g.encode(w_),
            Message::RegisterPool {
                token,
                spec,
                memory,
            } => pools::encode_register_pool(w_, token, spec, memory),
            Message::UnregisterPool { token, pool } => {
                pools::encode_unregister_pool(w_, token, *pool);
            }
            Message::Query(q) | Message::Acquire(q) => q.encode(w_),
            Message::Load(l) => l.encode(w_),
            Message::Publish(p) => p.encode(w_),
            Message::Release { token, lease } => query::encode_release(w_, token, *lease),
            Message::Stats | Message::Sync | Message::Released | Message::Synced => {}
            Message::Retire { namespace } => admin::encode_retire(w_, namespace),
            Message::Welcome { server, max_body } => {
                session::encode_welcome(w_, server, *max_body);
            }
            Message::Sealed {
                session,
                epoch,
                namespace,
                token,
            } => session::encode_sealed(w_, *session, *epoch, namespace, token),
            Message::PoolRegistered { pool } | Message::PoolUnregistered { pool } => {
                pools::encode_pool_registered(w_, *pool);
            }
            Message::Proof(p) => p.encode(w_),
            Message::Miss { reason, detail } => query::encode_miss(w_, *reason, detail),
            Message::Leased {
                lease,
                ttl_ms,
                proof,
            } => query::encode_leased(w_, *lease, *ttl_ms, proof),
            Message::Loaded { pages } | Message::PublishCopied { pages } => {
                transfer::encode_statuses(w_, pages);
            }
            Message::PublishDurable {
                pages,
                retry_after_ms,
            } => transfer::encode_publish_durable(w_, pages, *retry_after_ms),
            Message::StatsReply { text } => admin::encode_stats_reply(w_, text),
            Message::Retired { watermark } => admin::encode_retired(w_, *watermark),
            Message::Error {
                code,
                retry_after_ms,
                detail,
            } => errors::encode_error(w_, *code, *retry_after_ms, detail),
        }
        w.into_bytes()
    }

    /// Decodes a body of type `kind`.
    pub fn decode(kind: u16, body: &[u8]) -> Result<Self> {
        let k = KINDS
            .iter()
            .find(|k| k.code == kind)
            .ok_or(ProtocolError::UnknownType(kind))?;
        let mut r = Reader::new(body);
        let m = (k.decode)(&mut r)?;
        r.finish("message")?;
        Ok(m)
    }

    /// The whole frame for this message under request id `request`.
    pub fn encode_frame(&self, request: u64) -> Result<Vec<u8>> {
        crate::frame::encode_frame(self.kind(), request, &self.encode_body())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The byte tables every message kind must appear in.
    const PROTOCOL_MD: &str = include_str!("../../../../docs/protocol.md");

    #[test]
    fn every_kind_is_in_the_byte_tables() {
        for k in KINDS {
            let row = format!("| `{:#06X}` | {} |", k.code, k.name).replace("0X", "0x");
            assert!(
                PROTOCOL_MD.contains(&row),
                "docs/protocol.md lacks the row {row}"
            );
        }
    }

    #[test]
    fn kind_codes_are_distinct() {
        for (i, a) in KINDS.iter().enumerate() {
            for b in &KINDS[i + 1..] {
                assert_ne!(a.code, b.code, "{a:?} and {b:?}");
                assert_ne!(a.name, b.name, "{a:?} and {b:?}");
            }
        }
    }
}
