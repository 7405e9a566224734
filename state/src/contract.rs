//! `RecoveryContract`: one recovery rule per cache group, compiled from an instance's registered
//! layout. The rule says which records must exist for the engine to resume at a boundary B:
//!
//! | rule | components | required at boundary B |
//! |---|---|---|
//! | `Prefix` | dense KV, MLA | every page of [origin, B), contiguous |
//! | `Window { tokens: W }` | sliding-window KV | every page of [B − round_up(W − 1, block), B) |
//! | `Checkpoint { grid: G }` | SSM state, conv state | the state at exactly B, B on the grid |
//! | `Undefined` | DSA indexer, draft KV, auxiliary | nothing can be proven: always recompute |

use std::fmt;

use crate::component::{CacheGroupId, Component};
use crate::error::{Error, Result};
use crate::format::{FormatDigest, RankSpec};
use crate::key::HashDomain;
use crate::layout::StorageLayout;
use crate::namespace::Namespace;

/// How a group's state must be present to resume at a boundary.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Rule {
    /// Every page from the origin to the boundary (dense attention, MLA).
    Prefix,
    /// The trailing pages a sliding window of `tokens` needs.
    Window {
        /// Window size W in tokens (at least 2).
        tokens: u64,
    },
    /// An exact state checkpoint at the boundary, taken every `grid` tokens.
    Checkpoint {
        /// Checkpoint spacing in tokens.
        grid: u64,
    },
    /// No capability definition yet: the group's state can never be proven restorable.
    Undefined,
}

impl Rule {
    /// The rule's name.
    pub const fn name(self) -> &'static str {
        match self {
            Rule::Prefix => "prefix",
            Rule::Window { .. } => "window",
            Rule::Checkpoint { .. } => "checkpoint",
            Rule::Undefined => "undefined",
        }
    }
    fn fits(self, c: Component) -> bool {
        match self {
            Rule::Prefix => matches!(c, Component::DenseKv | Component::Mla),
            Rule::Window { .. } => c == Component::SlidingWindowKv,
            Rule::Checkpoint { .. } => matches!(c, Component::SsmState | Component::ConvState),
            Rule::Undefined => matches!(
                c,
                Component::DsaIndexer | Component::DraftKv | Component::Auxiliary
            ),
        }
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Rule::Window { tokens } => write!(f, "window({tokens})"),
            Rule::Checkpoint { grid } => write!(f, "checkpoint({grid})"),
            other => f.write_str(other.name()),
        }
    }
}

/// Which ranks hold a group's records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Ranks {
    /// One record per page, shared by every rank.
    Replicated,
    /// One record per page per rank `0..n`.
    Sharded(u32),
}

impl Ranks {
    /// Number of rank slots (1 when replicated).
    pub const fn slots(self) -> u32 {
        match self {
            Ranks::Replicated => 1,
            Ranks::Sharded(n) => n,
        }
    }
    /// The rank of slot `i`.
    pub const fn rank_of_slot(self, i: u32) -> RankSpec {
        match self {
            Ranks::Replicated => RankSpec::Replicated,
            Ranks::Sharded(_) => RankSpec::Rank(i),
        }
    }
    /// The slot of `rank`, when this group holds records of it.
    pub const fn slot_of(self, rank: RankSpec) -> Option<u32> {
        match (self, rank) {
            (Ranks::Replicated, RankSpec::Replicated) => Some(0),
            (Ranks::Sharded(n), RankSpec::Rank(r)) if r < n => Some(r),
            _ => None,
        }
    }
}

/// One group's compiled rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupContract {
    /// The group.
    pub group: CacheGroupId,
    /// Its component.
    pub component: Component,
    /// Its rule.
    pub rule: Rule,
    /// Tokens per page.
    pub block_tokens: u64,
    /// Which ranks hold records.
    pub ranks: Ranks,
    /// The format digest expected of each rank slot's records.
    pub formats: Vec<FormatDigest>,
}

/// The compiled rules of one registered instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecoveryContract {
    namespace: Namespace,
    domain: HashDomain,
    groups: Vec<GroupContract>,
}

impl RecoveryContract {
    /// Compiles `rules` (one per layout group) against the instance's layout. A rule that does not
    /// fit its group's component, a group without a rule, or a rule for an unknown group is
    /// refused; then every check of [`RecoveryContract::from_groups`] applies.
    pub fn compile(
        namespace: Namespace,
        domain: HashDomain,
        layout: &StorageLayout,
        rules: &[(CacheGroupId, Rule)],
    ) -> Result<Self> {
        for (id, _) in rules {
            if layout.group(*id).is_none() {
                return Err(Error::InvalidContract {
                    group: *id,
                    reason: "no such group in the layout".to_owned(),
                });
            }
            if rules.iter().filter(|(other, _)| other == id).count() > 1 {
                return Err(Error::InvalidContract {
                    group: *id,
                    reason: "more than one rule".to_owned(),
                });
            }
        }
        let mut groups = Vec::with_capacity(layout.groups().len());
        for spec in layout.groups() {
            let Some(&(_, rule)) = rules.iter().find(|(id, _)| *id == spec.id) else {
                return Err(Error::InvalidContract {
                    group: spec.id,
                    reason: "no recovery rule declared".to_owned(),
                });
            };
            let replicated =
                spec.formats.len() == 1 && spec.formats[0].rank == RankSpec::Replicated;
            let ranks = if replicated {
                Ranks::Replicated
            } else {
                Ranks::Sharded(spec.formats.len() as u32)
            };
            groups.push(GroupContract {
                group: spec.id,
                component: spec.component,
                rule,
                block_tokens: u64::from(spec.block_tokens),
                ranks,
                formats: layout
                    .format_digests(spec.id)
                    .map(<[FormatDigest]>::to_vec)
                    .unwrap_or_default(),
            });
        }
        Self::from_groups(namespace, domain, groups)
    }

    /// Builds a contract from group rules (for callers that already hold format digests). Groups
    /// are sorted by id; refused: no groups, duplicate groups, a rule that does not fit its component, a zero
    /// block size, a format count that does not match the rank slots, a window under 2 tokens, a
    /// zero checkpoint grid.
    pub fn from_groups(
        namespace: Namespace,
        domain: HashDomain,
        mut groups: Vec<GroupContract>,
    ) -> Result<Self> {
        groups.sort_by_key(|g| g.group);
        if groups.is_empty() {
            return Err(Error::InvalidContract {
                group: CacheGroupId(0),
                reason: "a contract needs at least one group".to_owned(),
            });
        }
        for (i, g) in groups.iter().enumerate() {
            let invalid = |reason: &str| Error::InvalidContract {
                group: g.group,
                reason: reason.to_owned(),
            };
            if i > 0 && groups[i - 1].group == g.group {
                return Err(invalid("more than one rule"));
            }
            if !g.rule.fits(g.component) {
                return Err(Error::RuleMismatch {
                    group: g.group,
                    rule: g.rule.name(),
                    component: g.component,
                });
            }
            if g.block_tokens == 0 {
                return Err(invalid("block size must be positive"));
            }
            if g.ranks.slots() == 0 || g.formats.len() != g.ranks.slots() as usize {
                return Err(invalid("one format digest per rank slot is required"));
            }
            match g.rule {
                Rule::Window { tokens } if tokens < 2 => {
                    return Err(invalid("a window must span at least 2 tokens"));
                }
                Rule::Checkpoint { grid: 0 } => {
                    return Err(invalid("checkpoint grid must be positive"));
                }
                _ => {}
            }
        }
        Ok(Self {
            namespace,
            domain,
            groups,
        })
    }

    /// The instance's namespace.
    pub fn namespace(&self) -> Namespace {
        self.namespace
    }
    /// The instance's hash domain.
    pub fn domain(&self) -> HashDomain {
        self.domain
    }
    /// Groups in id order.
    pub fn groups(&self) -> &[GroupContract] {
        &self.groups
    }

    /// The contract of `groups` alone (those of this contract's; others are ignored): what a
    /// request needs proven when it names only some of the groups. `None` when it names none.
    pub fn restricted_to(&self, groups: &[CacheGroupId]) -> Option<Self> {
        let kept: Vec<GroupContract> = self
            .groups
            .iter()
            .filter(|g| groups.contains(&g.group))
            .cloned()
            .collect();
        (!kept.is_empty()).then_some(Self {
            namespace: self.namespace,
            domain: self.domain,
            groups: kept,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::tests::two_rank_layout;

    #[test]
    fn compile_checks_rules_against_components() {
        let layout = two_rank_layout();
        let ns = Namespace([0; 32]);
        let d = HashDomain::VllmSha256Cbor;
        let c =
            RecoveryContract::compile(ns, d, &layout, &[(CacheGroupId(0), Rule::Prefix)]).unwrap();
        assert_eq!(c.groups()[0].ranks, Ranks::Sharded(2));
        assert!(matches!(
            RecoveryContract::compile(
                ns,
                d,
                &layout,
                &[(CacheGroupId(0), Rule::Checkpoint { grid: 16 })]
            ),
            Err(Error::RuleMismatch { .. })
        ));
        assert!(RecoveryContract::compile(ns, d, &layout, &[]).is_err());
        assert!(
            RecoveryContract::compile(
                ns,
                d,
                &layout,
                &[
                    (CacheGroupId(0), Rule::Prefix),
                    (CacheGroupId(1), Rule::Prefix)
                ]
            )
            .is_err()
        );
    }
}
