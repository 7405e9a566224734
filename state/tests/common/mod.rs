//! Builders shared by the validator tests.

#![expect(
    clippy::unwrap_used,
    reason = "test code: a failed unwrap is a failed test"
)]
#![allow(dead_code, reason = "shared by several test files; each uses a subset")]

use orbitkv_state::{
    CacheGroupId, Component, FormatDigest, GroupContract, HashDomain, Namespace, RankSpec, Ranks,
    RecordEvidence, RecoveryContract, Rule, StateKey, TokenRange,
};

pub const NS: Namespace = Namespace([1; 32]);
pub const DOMAIN: HashDomain = HashDomain::VllmSha256Cbor;

pub fn component_for(rule: Rule) -> Component {
    match rule {
        Rule::Prefix => Component::DenseKv,
        Rule::Window { .. } => Component::SlidingWindowKv,
        Rule::Checkpoint { .. } => Component::SsmState,
        Rule::Undefined => Component::DsaIndexer,
    }
}

pub fn format_digest(group: u32, slot: u32) -> FormatDigest {
    let mut d = [0u8; 32];
    d[..4].copy_from_slice(&group.to_le_bytes());
    d[4..8].copy_from_slice(&slot.to_le_bytes());
    FormatDigest(d)
}

pub fn group(id: u32, rule: Rule, block_tokens: u64, ranks: Ranks) -> GroupContract {
    GroupContract {
        group: CacheGroupId(id),
        component: component_for(rule),
        rule,
        block_tokens,
        ranks,
        formats: (0..ranks.slots()).map(|s| format_digest(id, s)).collect(),
    }
}

pub fn contract(groups: Vec<GroupContract>) -> RecoveryContract {
    RecoveryContract::from_groups(NS, DOMAIN, groups).unwrap()
}

/// An agreeing record of `g` for `rank` covering `[start, end)`; `salt` varies the native hash.
pub fn record(g: &GroupContract, rank: RankSpec, start: u64, end: u64, salt: u8) -> RecordEvidence {
    let slot = g.ranks.slot_of(rank).unwrap_or(0);
    let mut native = [0u8; 32];
    native[..8].copy_from_slice(&start.to_le_bytes());
    native[8..16].copy_from_slice(&end.to_le_bytes());
    native[16] = salt;
    RecordEvidence {
        key: StateKey::new(NS, DOMAIN, &native, g.group, g.component, rank).unwrap(),
        range: TokenRange::new(start, end).unwrap(),
        component: g.component,
        group: g.group,
        rank,
        format: format_digest(g.group.0, slot),
    }
}

/// Every page of `[from, to)` for every rank slot of `g`.
pub fn pages(g: &GroupContract, from: u64, to: u64) -> Vec<RecordEvidence> {
    let mut out = Vec::new();
    for slot in 0..g.ranks.slots() {
        let rank = g.ranks.rank_of_slot(slot);
        let mut s = from;
        while s < to {
            out.push(record(g, rank, s, s + g.block_tokens, 0));
            s += g.block_tokens;
        }
    }
    out
}
