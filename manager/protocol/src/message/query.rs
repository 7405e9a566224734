//! The query messages: Query and Acquire, their answers (Proof, Miss, Leased), and Release,
//! which ends a lease.

use super::fields::read_hash;
use super::{Body, MAX_QUERY_BLOCKS, MAX_QUERY_GROUPS, Message, Token};
use crate::error::{ProtocolError, Result};
use crate::wire::{Reader, Writer};

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

impl Body for QueryRequest {
    fn encode(&self, w: &mut Writer) {
        let q = self;
        w.raw(&q.token).u64(q.epoch).u64(q.origin).u64(q.end);
        w.u32(q.groups.len() as u32);
        for g in &q.groups {
            w.u32(g.group).u32(g.hashes.len() as u32);
            for h in &g.hashes {
                w.bytes8(h);
            }
        }
    }

    fn decode(r: &mut Reader<'_>) -> Result<Self> {
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
        if n > MAX_QUERY_GROUPS {
            return Err(ProtocolError::BadField {
                what: "query groups",
                why: format!("{n} groups, at most {MAX_QUERY_GROUPS}"),
            });
        }
        let mut groups = Vec::with_capacity(n);
        let mut blocks = 0usize;
        for _ in 0..n {
            let group = r.u32("group")?;
            let k = r.count("block hashes", 2)?;
            blocks = blocks.saturating_add(k);
            if blocks > MAX_QUERY_BLOCKS {
                return Err(ProtocolError::BadField {
                    what: "query block hashes",
                    why: format!("more than {MAX_QUERY_BLOCKS} over the query's groups"),
                });
            }
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

impl Body for Proof {
    fn encode(&self, w: &mut Writer) {
        let p = self;
        w.u64(p.boundary).u32(p.loads.len() as u32);
        for l in &p.loads {
            w.u32(l.group).u32(l.rank).u32(l.blocks.len() as u32);
            for b in &l.blocks {
                w.u32(*b);
            }
        }
    }

    fn decode(r: &mut Reader<'_>) -> Result<Self> {
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
}

pub(super) fn encode_miss(w: &mut Writer, reason: u16, detail: &str) {
    w.u16(reason).bytes16(detail.as_bytes());
}

pub(super) fn decode_miss(r: &mut Reader<'_>) -> Result<Message> {
    Ok(Message::Miss {
        reason: r.u16("miss reason")?,
        detail: r.text16("detail")?,
    })
}

pub(super) fn encode_leased(w: &mut Writer, lease: u64, ttl_ms: u32, proof: &Proof) {
    w.u64(lease).u32(ttl_ms);
    proof.encode(w);
}

pub(super) fn decode_leased(r: &mut Reader<'_>) -> Result<Message> {
    Ok(Message::Leased {
        lease: r.u64("lease")?,
        ttl_ms: r.u32("ttl")?,
        proof: Proof::decode(r)?,
    })
}

pub(super) fn encode_release(w: &mut Writer, token: &Token, lease: u64) {
    w.raw(token).u64(lease);
}

pub(super) fn decode_release(r: &mut Reader<'_>) -> Result<Message> {
    Ok(Message::Release {
        token: r.array("token")?,
        lease: r.u64("lease")?,
    })
}
