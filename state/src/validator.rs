//! The recovery-contract validator: given a contract, the requested range and evidence of which
//! records exist, returns the **largest** boundary B it can prove restorable, with the exact
//! records to load per group and rank, or a typed reason to recompute.
//!
//! Semantics (the property tests check these against a brute-force oracle):
//!
//! - The request is `[origin, end)` in absolute tokens; `origin` is the engine's valid HBM prefix.
//!   Tokens before the origin count as present and are never renumbered. Candidates satisfy
//!   `origin < B ≤ end`.
//! - A record is *agreeing* when its namespace, hash domain, group, component, rank and format
//!   digest match the contract (and its key carries the same group, component and rank), and its
//!   range is aligned: for page rules it starts on the group's block grid and spans at most one
//!   block; for checkpoints it spans exactly one grid cell `[B − G, B)` with `B % G == 0`.
//!   Disagreeing records are treated as absent and reported.
//! - Agreeing records of one (group, rank) that share any token are *ambiguous*: all of them are
//!   treated as absent and reported (a duplicate is an overlap with an identical range).
//! - The remaining records of one (group, rank) are disjoint. At B:
//!   `Prefix` needs a contiguous chain covering `[origin, B)` whose last record ends at B;
//!   `Window { W }` needs a contiguous chain covering `[max(origin, B − round_up(W − 1, block)), B)`
//!   whose last record ends at B; `Checkpoint` needs a record ending at B; `Undefined` is never
//!   satisfied. Every rank slot of every group must be satisfied at the same B.
//!
//! Cost is O(n log n) in the number of records (sorting; linear when they arrive sorted).
//! It is one file because the proof is one algorithm: classification, buckets, candidates and
//! the common boundary share private types, and the semantics read top to bottom.

use std::fmt;

use crate::component::{CacheGroupId, Component};
use crate::contract::{GroupContract, RecoveryContract, Rule};
use crate::format::{FormatDigest, RankSpec};
use crate::key::StateKey;
use crate::range::TokenRange;

/// What is known about one stored record, without its payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordEvidence {
    /// The record's key.
    pub key: StateKey,
    /// Tokens it covers.
    pub range: TokenRange,
    /// Its component.
    pub component: Component,
    /// Its cache group.
    pub group: CacheGroupId,
    /// Its rank.
    pub rank: RankSpec,
    /// Its format digest.
    pub format: FormatDigest,
}

/// The tokens a request wants restored: `[origin, end)` in absolute positions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RestoreRequest {
    /// The engine's valid HBM prefix: tokens before it are present already.
    pub origin: u64,
    /// One past the last token the request could use.
    pub end: u64,
}

/// Why a record was treated as absent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Disagreement {
    /// Key namespace is not the contract's.
    Namespace,
    /// Key hash domain is not the contract's.
    Domain,
    /// The record names a group the contract does not have.
    UnknownGroup,
    /// Component differs from the group's.
    Component,
    /// The record's rank is not one of the group's rank slots.
    Rank,
    /// The key's group, component or rank differ from the record's.
    KeyFields,
    /// Format digest differs from the one registered for that group and rank.
    Format,
    /// Range not aligned to the group's block or checkpoint grid.
    Misaligned,
    /// Shares tokens with record `with` of the same group and rank.
    Overlap {
        /// Index of another record of the ambiguous set.
        with: usize,
    },
    /// Covers exactly the same tokens as record `with` of the same group and rank.
    Duplicate {
        /// Index of the other record.
        with: usize,
    },
}

/// A record treated as absent, and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Exclusion {
    /// Index into the evidence.
    pub index: usize,
    /// Why.
    pub reason: Disagreement,
}

/// Why nothing beyond the origin can be restored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recompute {
    /// The request has no tokens beyond its origin.
    NothingBeyondOrigin,
    /// A group's component has no capability definition.
    UnsupportedComponent {
        /// The group.
        group: CacheGroupId,
        /// Its component.
        component: Component,
    },
    /// No usable record covers token `at`.
    Gap {
        /// The group.
        group: CacheGroupId,
        /// The rank.
        rank: RankSpec,
        /// First uncovered token.
        at: u64,
    },
    /// The records covering `at` overlap each other.
    Overlap {
        /// The group.
        group: CacheGroupId,
        /// The rank.
        rank: RankSpec,
        /// The token whose records conflict.
        at: u64,
    },
    /// Token `at` is covered by duplicate records.
    Duplicate {
        /// The group.
        group: CacheGroupId,
        /// The rank.
        rank: RankSpec,
        /// The token whose records conflict.
        at: u64,
    },
    /// The record covering `at` ends past the request's end, so no boundary lies inside it.
    PastEnd {
        /// The group.
        group: CacheGroupId,
        /// The rank.
        rank: RankSpec,
        /// The token it covers.
        at: u64,
    },
    /// Other ranks of the group have agreeing records, this one has none.
    MissingRank {
        /// The group.
        group: CacheGroupId,
        /// The rank.
        rank: RankSpec,
    },
    /// No boundary has the window's trailing pages complete.
    WindowIncomplete {
        /// The group.
        group: CacheGroupId,
        /// The rank.
        rank: RankSpec,
    },
    /// No checkpoint inside (origin, end].
    NoCheckpoint {
        /// The group.
        group: CacheGroupId,
        /// The rank.
        rank: RankSpec,
    },
    /// Every group can restore some boundary, but no boundary satisfies all of them.
    NoCommonBoundary,
}

impl fmt::Display for Recompute {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Recompute::NothingBeyondOrigin => f.write_str("nothing beyond the origin"),
            Recompute::UnsupportedComponent { group, component } => {
                write!(
                    f,
                    "group {group}: component {component} has no capability definition"
                )
            }
            Recompute::Gap { group, rank, at } => write!(f, "group {group} {rank}: gap at {at}"),
            Recompute::Overlap { group, rank, at } => {
                write!(f, "group {group} {rank}: overlapping records at {at}")
            }
            Recompute::Duplicate { group, rank, at } => {
                write!(f, "group {group} {rank}: duplicate records at {at}")
            }
            Recompute::PastEnd { group, rank, at } => {
                write!(
                    f,
                    "group {group} {rank}: the record at {at} ends past the request"
                )
            }
            Recompute::MissingRank { group, rank } => {
                write!(f, "group {group}: no records for {rank}")
            }
            Recompute::WindowIncomplete { group, rank } => {
                write!(
                    f,
                    "group {group} {rank}: no boundary with a complete window"
                )
            }
            Recompute::NoCheckpoint { group, rank } => {
                write!(f, "group {group} {rank}: no checkpoint in range")
            }
            Recompute::NoCommonBoundary => f.write_str("no boundary satisfies every group"),
        }
    }
}

/// The records to load for one group and rank, as evidence indices in token order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupLoad {
    /// The group.
    pub group: CacheGroupId,
    /// The rank.
    pub rank: RankSpec,
    /// Evidence indices, in token order.
    pub records: Vec<usize>,
}

/// A proven restorable boundary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Proof {
    /// The largest boundary B every group satisfies.
    pub boundary: u64,
    /// Exactly the records to load, per group and rank slot, in contract order.
    pub loads: Vec<GroupLoad>,
}

/// Restore or recompute.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Restore up to the proof's boundary.
    Restore(Proof),
    /// Recompute, for this reason.
    Recompute(Recompute),
}

/// The validator's answer: the outcome and every record it treated as absent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Validation {
    /// Restore or recompute.
    pub outcome: Outcome,
    /// Records treated as absent, in evidence order.
    pub excluded: Vec<Exclusion>,
}

impl Validation {
    /// The proven boundary, when there is one.
    pub fn boundary(&self) -> Option<u64> {
        match &self.outcome {
            Outcome::Restore(p) => Some(p.boundary),
            Outcome::Recompute(_) => None,
        }
    }
}

/// `round_up(v, to)`; `to > 0`.
fn round_up(v: u64, to: u64) -> u64 {
    v.div_ceil(to).saturating_mul(to)
}

/// Checks one record against the contract; returns its bucket (group index, slot).
fn classify(
    contract: &RecoveryContract,
    rec: &RecordEvidence,
) -> Result<(usize, u32), Disagreement> {
    if rec.key.namespace != contract.namespace() {
        return Err(Disagreement::Namespace);
    }
    if rec.key.hash.domain() != contract.domain() {
        return Err(Disagreement::Domain);
    }
    let groups = contract.groups();
    let gi = groups
        .binary_search_by_key(&rec.group, |g| g.group)
        .map_err(|_| Disagreement::UnknownGroup)?;
    let g = &groups[gi];
    if rec.component != g.component {
        return Err(Disagreement::Component);
    }
    let slot = g.ranks.slot_of(rec.rank).ok_or(Disagreement::Rank)?;
    if rec.key.hash.group() != rec.group
        || rec.key.hash.component() != rec.component
        || rec.key.hash.rank() != rec.rank
    {
        return Err(Disagreement::KeyFields);
    }
    if g.formats[slot as usize] != rec.format {
        return Err(Disagreement::Format);
    }
    let r = rec.range;
    let aligned = match g.rule {
        Rule::Checkpoint { grid } => r.end().is_multiple_of(grid) && r.len() == grid,
        _ => r.start().is_multiple_of(g.block_tokens) && r.len() <= g.block_tokens,
    };
    if !aligned {
        return Err(Disagreement::Misaligned);
    }
    Ok((gi, slot))
}

struct Bucket {
    group: usize,
    slot: u32,
    /// Agreeing records sorted by (start, end, index), ambiguous ones included.
    sorted: Vec<usize>,
    /// Parallel to `sorted`: marked ambiguous.
    ambiguous: Vec<bool>,
    /// Usable records (sorted, disjoint).
    usable: Vec<usize>,
    /// Candidate boundaries, ascending.
    candidates: Vec<u64>,
}

/// Validates `evidence` against `contract` for `request`.
pub fn validate(
    contract: &RecoveryContract,
    request: RestoreRequest,
    evidence: &[RecordEvidence],
) -> Validation {
    let groups = contract.groups();
    // Bucket agreeing records by (group, rank slot).
    let mut offsets = Vec::with_capacity(groups.len() + 1);
    let mut total = 0usize;
    for g in groups {
        offsets.push(total);
        total += g.ranks.slots() as usize;
    }
    let mut buckets: Vec<Bucket> = Vec::with_capacity(total);
    for (gi, g) in groups.iter().enumerate() {
        for slot in 0..g.ranks.slots() {
            buckets.push(Bucket {
                group: gi,
                slot,
                sorted: Vec::new(),
                ambiguous: Vec::new(),
                usable: Vec::new(),
                candidates: Vec::new(),
            });
        }
    }
    let mut excluded = Vec::new();
    for (i, rec) in evidence.iter().enumerate() {
        match classify(contract, rec) {
            Ok((gi, slot)) => buckets[offsets[gi] + slot as usize].sorted.push(i),
            Err(reason) => excluded.push(Exclusion { index: i, reason }),
        }
    }

    for b in &mut buckets {
        let g = &groups[b.group];
        b.sorted.sort_unstable_by_key(|&i| {
            let r = evidence[i].range;
            (r.start(), r.end(), i)
        });
        mark_ambiguous(b, evidence, &mut excluded);
        b.usable = b
            .sorted
            .iter()
            .zip(&b.ambiguous)
            .filter(|(_, amb)| !**amb)
            .map(|(&i, _)| i)
            .collect();
        b.candidates = candidates(g, &b.usable, evidence, request);
    }
    excluded.sort_unstable_by_key(|e| e.index);

    let early = if let Some(g) = groups.iter().find(|g| g.rule == Rule::Undefined) {
        Some(Recompute::UnsupportedComponent {
            group: g.group,
            component: g.component,
        })
    } else if request.end <= request.origin {
        Some(Recompute::NothingBeyondOrigin)
    } else {
        None
    };
    if let Some(reason) = early {
        return Validation {
            outcome: Outcome::Recompute(reason),
            excluded,
        };
    }
    // A bucket with no candidate decides the reason.
    if let Some(b) = buckets.iter().find(|b| b.candidates.is_empty()) {
        let reason = empty_reason(b, &buckets, groups, evidence, request);
        return Validation {
            outcome: Outcome::Recompute(reason),
            excluded,
        };
    }
    let Some(boundary) = common_max(&buckets) else {
        return Validation {
            outcome: Outcome::Recompute(Recompute::NoCommonBoundary),
            excluded,
        };
    };
    let loads = buckets
        .iter()
        .map(|b| {
            let g = &groups[b.group];
            GroupLoad {
                group: g.group,
                rank: g.ranks.rank_of_slot(b.slot),
                records: records_to_load(g, &b.usable, evidence, request, boundary),
            }
        })
        .collect();
    Validation {
        outcome: Outcome::Restore(Proof { boundary, loads }),
        excluded,
    }
}

/// Marks every record of an overlapping cluster ambiguous and reports it, in one pass over the
/// sorted bucket (identical ranges are adjacent there).
fn mark_ambiguous(b: &mut Bucket, evidence: &[RecordEvidence], excluded: &mut Vec<Exclusion>) {
    let n = b.sorted.len();
    b.ambiguous = vec![false; n];
    let range = |pos: usize| evidence[b.sorted[pos]].range;
    let mut cluster_start = 0usize;
    let mut cluster_end = 0u64;
    for pos in 0..=n {
        let closes = pos == n || pos == 0 || range(pos).start() >= cluster_end;
        if closes && pos > cluster_start + 1 {
            // Every member of [cluster_start, pos) overlaps another member.
            let mut widest = cluster_start;
            for k in cluster_start..pos {
                b.ambiguous[k] = true;
                let r = range(k);
                let twin = if k > cluster_start && range(k - 1) == r {
                    Some(k - 1)
                } else if k + 1 < pos && range(k + 1) == r {
                    Some(k + 1)
                } else {
                    None
                };
                let reason = match twin {
                    Some(t) => Disagreement::Duplicate { with: b.sorted[t] },
                    // The first member overlaps the second; a later one overlaps the earlier
                    // member reaching furthest (that is why it joined the cluster).
                    None if k == cluster_start => Disagreement::Overlap {
                        with: b.sorted[k + 1],
                    },
                    None => Disagreement::Overlap {
                        with: b.sorted[widest],
                    },
                };
                excluded.push(Exclusion {
                    index: b.sorted[k],
                    reason,
                });
                if r.end() > range(widest).end() {
                    widest = k;
                }
            }
        }
        if closes {
            cluster_start = pos;
            cluster_end = 0;
        }
        if pos < n {
            cluster_end = cluster_end.max(range(pos).end());
        }
    }
}

/// The window's required span before B, in tokens.
fn window_span(g: &GroupContract) -> u64 {
    match g.rule {
        Rule::Window { tokens } => round_up(tokens - 1, g.block_tokens),
        _ => 0,
    }
}

/// Boundaries in (origin, end] this bucket's rule is satisfied at, ascending.
fn candidates(
    g: &GroupContract,
    usable: &[usize],
    evidence: &[RecordEvidence],
    req: RestoreRequest,
) -> Vec<u64> {
    let range = |i: usize| evidence[i].range;
    let mut out = Vec::new();
    match g.rule {
        Rule::Prefix => {
            // First record ending after the origin must cover it; then follow the chain.
            let first = usable.partition_point(|&i| range(i).end() <= req.origin);
            let Some(&i0) = usable.get(first) else {
                return out;
            };
            if range(i0).start() > req.origin {
                return out;
            }
            let mut prev_end = range(i0).start();
            for &i in &usable[first..] {
                let r = range(i);
                if r.start() != prev_end || r.end() > req.end {
                    break;
                }
                out.push(r.end());
                prev_end = r.end();
            }
        }
        Rule::Window { .. } => {
            let span = window_span(g);
            let mut run_start = 0u64;
            let mut prev_end = None;
            for &i in usable {
                let r = range(i);
                if prev_end != Some(r.start()) {
                    run_start = r.start();
                }
                prev_end = Some(r.end());
                if r.end() <= req.origin || r.end() > req.end {
                    continue;
                }
                let need_from = req.origin.max(r.end().saturating_sub(span));
                if run_start <= need_from {
                    out.push(r.end());
                }
            }
        }
        Rule::Checkpoint { .. } => {
            out.extend(
                usable
                    .iter()
                    .map(|&i| range(i).end())
                    .filter(|&e| e > req.origin && e <= req.end),
            );
        }
        Rule::Undefined => {}
    }
    out
}

/// Largest boundary present in every bucket's candidates.
fn common_max(buckets: &[Bucket]) -> Option<u64> {
    let smallest = buckets.iter().min_by_key(|b| b.candidates.len())?;
    smallest.candidates.iter().rev().copied().find(|c| {
        buckets
            .iter()
            .all(|b| b.candidates.binary_search(c).is_ok())
    })
}

fn records_to_load(
    g: &GroupContract,
    usable: &[usize],
    evidence: &[RecordEvidence],
    req: RestoreRequest,
    boundary: u64,
) -> Vec<usize> {
    let range = |i: usize| evidence[i].range;
    let from = match g.rule {
        Rule::Prefix => req.origin,
        Rule::Window { .. } => req.origin.max(boundary.saturating_sub(window_span(g))),
        Rule::Checkpoint { .. } => boundary - 1,
        Rule::Undefined => boundary,
    };
    let lo = usable.partition_point(|&i| range(i).end() <= from);
    let hi = usable.partition_point(|&i| range(i).end() <= boundary);
    usable[lo..hi].to_vec()
}

/// The ambiguous record of the bucket that best explains an empty candidate set: the first one
/// covering `at`, or with `any_after`, the first one ending after `at`. Returns (token, duplicate?).
fn ambiguity(
    b: &Bucket,
    evidence: &[RecordEvidence],
    at: u64,
    any_after: bool,
) -> Option<(u64, bool)> {
    let pos = (0..b.sorted.len()).find(|&p| {
        let r = evidence[b.sorted[p]].range;
        b.ambiguous[p] && (r.contains(at) || (any_after && r.end() > at))
    })?;
    let r = evidence[b.sorted[pos]].range;
    let twin = |q: usize| evidence[b.sorted[q]].range == r;
    let duplicate = (pos > 0 && twin(pos - 1)) || (pos + 1 < b.sorted.len() && twin(pos + 1));
    Some((r.start().max(at), duplicate))
}

fn empty_reason(
    b: &Bucket,
    buckets: &[Bucket],
    groups: &[GroupContract],
    evidence: &[RecordEvidence],
    req: RestoreRequest,
) -> Recompute {
    let g = &groups[b.group];
    let rank = g.ranks.rank_of_slot(b.slot);
    let group = g.group;
    if b.sorted.is_empty()
        && buckets
            .iter()
            .any(|o| o.group == b.group && !o.sorted.is_empty())
    {
        return Recompute::MissingRank { group, rank };
    }
    let conflict = |at: u64, any_after: bool| {
        ambiguity(b, evidence, at, any_after).map(|(at, duplicate)| {
            if duplicate {
                Recompute::Duplicate { group, rank, at }
            } else {
                Recompute::Overlap { group, rank, at }
            }
        })
    };
    match g.rule {
        Rule::Prefix => {
            let at = req.origin;
            if let Some(reason) = conflict(at, false) {
                return reason;
            }
            let covering = b
                .usable
                .iter()
                .any(|&i| evidence[i].range.contains(at) && evidence[i].range.end() > req.end);
            if covering {
                Recompute::PastEnd { group, rank, at }
            } else {
                Recompute::Gap { group, rank, at }
            }
        }
        Rule::Window { .. } => {
            conflict(req.origin, true).unwrap_or(Recompute::WindowIncomplete { group, rank })
        }
        Rule::Checkpoint { .. } => {
            conflict(req.origin, true).unwrap_or(Recompute::NoCheckpoint { group, rank })
        }
        Rule::Undefined => Recompute::UnsupportedComponent {
            group,
            component: g.component,
        },
    }
}
