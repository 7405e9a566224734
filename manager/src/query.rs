//! Query and Acquire: from the engine's block hashes to the validator's proof. For every group
//! the query names and every rank slot of that group, each block's state key is derived (the
//! instance's namespace and hash domain, the native hash, the group's component, the rank) and
//! looked up in the store's index; what is present becomes the validator's evidence, and the
//! validator decides the largest restorable boundary, or why nothing beyond the origin can be
//! restored. No side effects: the scheduler may ask again and again.

use orbitkv_protocol::ErrorCode;
use orbitkv_protocol::message::{Proof, ProofLoad, QueryRequest};
use orbitkv_protocol::miss::miss_code;
use orbitkv_state::{
    CacheGroupId, Disagreement, Outcome, RankSpec, Ranks, RecordEvidence, RestoreRequest, StateKey,
    validate,
};
use orbitkv_store::StateStore;

use crate::session::{Refusal, SealedInstance};

/// Where a piece of evidence came from: its group, rank, block index and key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Located {
    /// The cache group.
    pub group: u32,
    /// The rank slot.
    pub rank: RankSpec,
    /// The block index in the query's hash list.
    pub block: u32,
    /// The record's key.
    pub key: StateKey,
}

/// A query's answer: the proof with the keys it names, or a miss.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// Restore up to the proof's boundary; `keys` parallel to the proof's blocks, flattened in
    /// load order.
    Hit {
        /// The proof as sent.
        proof: Proof,
        /// Each proven record, in the order of the proof's loads and blocks.
        records: Vec<Located>,
    },
    /// Recompute.
    Miss {
        /// The reason's code (docs/protocol.md).
        reason: u16,
        /// A readable account.
        detail: String,
    },
}

/// The index of a validator rejection (a record treated as absent) in
/// [`crate::metrics::REJECTION_REASONS`].
pub fn rejection_code(d: &Disagreement) -> usize {
    match d {
        Disagreement::Namespace => 0,
        Disagreement::Domain => 1,
        Disagreement::UnknownGroup => 2,
        Disagreement::Component => 3,
        Disagreement::Rank => 4,
        Disagreement::KeyFields => 5,
        Disagreement::Format => 6,
        Disagreement::Misaligned => 7,
        Disagreement::Overlap { .. } => 8,
        Disagreement::Duplicate { .. } => 9,
    }
}

/// Answers `q` for `inst` from `store`'s index; also returns why each record the validator
/// treated as absent was (for the metrics).
pub fn answer(
    inst: &SealedInstance,
    store: &StateStore,
    q: &QueryRequest,
) -> Result<(Answer, Vec<Disagreement>), Refusal> {
    let malformed = |d: String| Refusal::new(ErrorCode::Malformed, d);
    let mut evidence = Vec::new();
    let mut located = Vec::new();
    for g in &q.groups {
        let contract = inst
            .contract
            .groups()
            .iter()
            .find(|c| c.group == CacheGroupId(g.group))
            .ok_or_else(|| malformed(format!("cache group {} is not in the layout", g.group)))?;
        let ranks: Vec<RankSpec> = match contract.ranks {
            Ranks::Replicated => vec![RankSpec::Replicated],
            Ranks::Sharded(n) => (0..n).map(RankSpec::Rank).collect(),
        };
        for (block, hash) in g.hashes.iter().enumerate() {
            for rank in &ranks {
                let key = StateKey::new(
                    inst.namespace,
                    inst.domain,
                    hash,
                    contract.group,
                    contract.component,
                    *rank,
                )
                .map_err(|e| malformed(format!("group {} block {block}: {e}", g.group)))?;
                let Some(rec) = store.index().get(&key) else {
                    continue;
                };
                evidence.push(RecordEvidence {
                    key,
                    range: rec.range,
                    component: contract.component,
                    group: contract.group,
                    rank: *rank,
                    format: rec.format,
                });
                located.push(Located {
                    group: g.group,
                    rank: *rank,
                    block: block as u32,
                    key,
                });
            }
        }
    }
    // The groups the request names are the ones proven: an engine that restores one pool at a
    // time (SGLang's KV pages, then a hybrid model's other pools) asks for that pool alone.
    let named: Vec<CacheGroupId> = q.groups.iter().map(|g| CacheGroupId(g.group)).collect();
    let restricted;
    let every = inst
        .contract
        .groups()
        .iter()
        .all(|g| named.contains(&g.group));
    let contract = if every {
        &inst.contract
    } else {
        restricted = inst
            .contract
            .restricted_to(&named)
            .ok_or_else(|| malformed("a query names no cache group".to_owned()))?;
        &restricted
    };
    let v = validate(
        contract,
        RestoreRequest {
            origin: q.origin,
            end: q.end,
        },
        &evidence,
    );
    let rejected = v.excluded.iter().map(|e| e.reason).collect();
    let answer = match v.outcome {
        Outcome::Recompute(r) => Answer::Miss {
            reason: miss_code(&r),
            detail: r.to_string(),
        },
        Outcome::Restore(p) => {
            let mut records = Vec::new();
            let loads = p
                .loads
                .iter()
                .map(|l| {
                    let blocks = l
                        .records
                        .iter()
                        .filter_map(|&i| located.get(i))
                        .map(|loc| {
                            records.push(*loc);
                            loc.block
                        })
                        .collect();
                    ProofLoad {
                        group: l.group.0,
                        rank: l.rank.code(),
                        blocks,
                    }
                })
                .collect();
            Answer::Hit {
                proof: Proof {
                    boundary: p.boundary,
                    loads,
                },
                records,
            }
        }
    };
    Ok((answer, rejected))
}
