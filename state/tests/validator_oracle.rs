//! The validator against a brute-force oracle: soundness (every group's rule holds at B for every
//! rank, every listed record exists and agrees), maximality (no larger boundary satisfies all
//! groups), origin respected, disagreeing or ambiguous records never used.

#![expect(
    clippy::unwrap_used,
    reason = "test code: a failed unwrap is a failed test"
)]

mod common;

use common::*;
use orbitkv_state::{
    CacheGroupId, Component, GroupContract, HashDomain, Namespace, Outcome, RankSpec, Ranks,
    RecordEvidence, RecoveryContract, RestoreRequest, Rule, StateKey, TokenRange, validate,
};
use proptest::prelude::*;

/// Independent restatement of "agreeing" (see the validator's module docs).
fn agrees(c: &RecoveryContract, r: &RecordEvidence) -> Option<(usize, u32)> {
    let gi = c.groups().iter().position(|g| g.group == r.group)?;
    let g = &c.groups()[gi];
    let slot = (0..g.ranks.slots()).find(|&s| g.ranks.rank_of_slot(s) == r.rank)?;
    let key_ok = r.key.namespace == c.namespace()
        && r.key.hash.domain() == c.domain()
        && r.key.hash.group() == r.group
        && r.key.hash.component() == r.component
        && r.key.hash.rank() == r.rank;
    let aligned = match g.rule {
        Rule::Checkpoint { grid } => r.range.end().is_multiple_of(grid) && r.range.len() == grid,
        _ => r.range.start().is_multiple_of(g.block_tokens) && r.range.len() <= g.block_tokens,
    };
    let ok =
        key_ok && r.component == g.component && g.formats[slot as usize] == r.format && aligned;
    ok.then_some((gi, slot))
}

/// Usable = agreeing and sharing no token with another agreeing record of the same bucket.
fn usable(c: &RecoveryContract, ev: &[RecordEvidence]) -> Vec<Option<(usize, u32)>> {
    let buckets: Vec<_> = ev.iter().map(|r| agrees(c, r)).collect();
    (0..ev.len())
        .map(|i| {
            let b = buckets[i]?;
            let clash = (0..ev.len())
                .any(|j| j != i && buckets[j] == Some(b) && ev[j].range.overlaps(ev[i].range));
            (!clash).then_some(b)
        })
        .collect()
}

fn lower_bound(g: &GroupContract, origin: u64, b: u64) -> u64 {
    match g.rule {
        Rule::Prefix => origin,
        Rule::Window { tokens } => {
            let span = (tokens - 1).div_ceil(g.block_tokens) * g.block_tokens;
            origin.max(b.saturating_sub(span))
        }
        _ => b - 1,
    }
}

/// Walks backwards from `b` over records of `recs`; true when it reaches `lower` or earlier.
fn chain_back(recs: &[&RecordEvidence], lower: u64, b: u64) -> bool {
    let mut cur = b;
    loop {
        let Some(r) = recs.iter().find(|r| r.range.end() == cur) else {
            return false;
        };
        if r.range.start() <= lower {
            return true;
        }
        cur = r.range.start();
    }
}

fn satisfied(
    c: &RecoveryContract,
    ev: &[RecordEvidence],
    ok: &[Option<(usize, u32)>],
    req: RestoreRequest,
    b: u64,
) -> bool {
    c.groups().iter().enumerate().all(|(gi, g)| {
        (0..g.ranks.slots()).all(|slot| {
            let recs: Vec<&RecordEvidence> = ev
                .iter()
                .zip(ok)
                .filter(|(_, u)| **u == Some((gi, slot)))
                .map(|(r, _)| r)
                .collect();
            match g.rule {
                Rule::Prefix | Rule::Window { .. } => {
                    chain_back(&recs, lower_bound(g, req.origin, b), b)
                }
                Rule::Checkpoint { .. } => recs.iter().any(|r| r.range.end() == b),
                Rule::Undefined => false,
            }
        })
    })
}

fn oracle(c: &RecoveryContract, ev: &[RecordEvidence], req: RestoreRequest) -> Option<u64> {
    let ok = usable(c, ev);
    (req.origin + 1..=req.end)
        .rev()
        .find(|&b| satisfied(c, ev, &ok, req, b))
}

fn rule_strategy() -> impl Strategy<Value = (Rule, u64, Ranks)> {
    let block = prop_oneof![Just(1u64), Just(2), Just(4)];
    let ranks = prop_oneof![
        Just(Ranks::Sharded(1)),
        Just(Ranks::Sharded(2)),
        Just(Ranks::Replicated)
    ];
    (0u8..3, block, ranks, 2u64..12, 1u64..4).prop_map(|(kind, block, ranks, w, gm)| {
        let rule = match kind {
            0 => Rule::Prefix,
            1 => Rule::Window { tokens: w },
            _ => Rule::Checkpoint { grid: block * gm },
        };
        (rule, block, ranks)
    })
}

/// A raw record: (group index, slot, block index or start, length kind, corruption kind, salt).
type Raw = (usize, u32, u64, u8, u8, u8);

fn build(groups: &[GroupContract], raws: &[Raw]) -> Vec<RecordEvidence> {
    raws.iter()
        .map(|&(gi, slot, pos, len_kind, corrupt, salt)| {
            let g = &groups[gi % groups.len()];
            let rank = g.ranks.rank_of_slot(slot % g.ranks.slots());
            let (start, end) = match g.rule {
                Rule::Checkpoint { grid } => {
                    let e = (pos % 12 + 1) * grid;
                    match len_kind % 8 {
                        0 => (e - 1, e), // misaligned for grid > 1
                        _ => (e - grid, e),
                    }
                }
                _ => {
                    let s = (pos % 24) * g.block_tokens;
                    match len_kind % 10 {
                        0 => (s + 1, s + 1 + g.block_tokens), // misaligned (unless block 1)
                        1 => (s, s + 2 * g.block_tokens),     // spans two blocks
                        2 if g.block_tokens > 1 => (s, s + 1), // partial page
                        _ => (s, s + g.block_tokens),
                    }
                }
            };
            let mut r = record(g, rank, start, end, salt);
            let rekey = |r: &RecordEvidence, ns, domain: HashDomain, group, component, rank| {
                StateKey::new(
                    ns,
                    domain,
                    &r.key.hash.native()[..domain.native_len()],
                    group,
                    component,
                    rank,
                )
                .unwrap()
            };
            match corrupt % 16 {
                0 => r.format = format_digest(99, 0),
                1 => r.key = rekey(&r, Namespace([2; 32]), DOMAIN, r.group, r.component, r.rank),
                2 => {
                    r.key = rekey(
                        &r,
                        NS,
                        HashDomain::SglangSha256,
                        r.group,
                        r.component,
                        r.rank,
                    )
                }
                3 => {
                    r.group = CacheGroupId(77);
                    r.key = rekey(&r, NS, DOMAIN, r.group, r.component, r.rank);
                }
                4 => {
                    r.rank = RankSpec::Rank(5);
                    r.key = rekey(&r, NS, DOMAIN, r.group, r.component, r.rank);
                }
                5 => {
                    r.key = rekey(
                        &r,
                        NS,
                        DOMAIN,
                        CacheGroupId(r.group.0 + 1),
                        r.component,
                        r.rank,
                    )
                }
                6 => {
                    r.component = Component::Auxiliary;
                    r.key = rekey(&r, NS, DOMAIN, r.group, r.component, r.rank);
                }
                _ => {}
            }
            r
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn validator_matches_brute_force_oracle(
        rules in prop::collection::vec(rule_strategy(), 1..4),
        raws in prop::collection::vec((0usize..3, 0u32..2, 0u64..24, any::<u8>(), any::<u8>(), 0u8..2), 0..24),
        dense in prop::collection::vec(prop::option::weighted(0.8, (prop_oneof![3 => Just(0u64), 1 => 0u64..24], 0u64..24)), 3),
        origin in prop_oneof![Just(0u64), 0u64..30],
        len in 0u64..60,
        rotation in any::<usize>(),
    ) {
        let groups: Vec<GroupContract> = rules
            .iter()
            .enumerate()
            .map(|(i, &(rule, block, ranks))| group(i as u32, rule, block, ranks))
            .collect();
        let c = contract(groups.clone());
        let mut ev = build(&groups, &raws);
        // Add complete runs so that deep hits are common.
        for (g, run) in groups.iter().zip(&dense) {
            let Some((a, b)) = *run else { continue };
            let (from, to) = (a.min(b) * g.block_tokens, a.max(b) * g.block_tokens);
            match g.rule {
                Rule::Checkpoint { grid } => {
                    for slot in 0..g.ranks.slots() {
                        let mut e = (from / grid + 1) * grid;
                        while e <= to + grid {
                            ev.push(record(g, g.ranks.rank_of_slot(slot), e - grid, e, 7));
                            e += grid;
                        }
                    }
                }
                _ => ev.extend(pages(g, from, to)),
            }
        }
        // Evidence order must not matter.
        let rotate = if ev.is_empty() { 0 } else { rotation % ev.len() };
        ev.rotate_left(rotate);
        let req = RestoreRequest { origin, end: origin + len };
        let v = validate(&c, req, &ev);
        let want = oracle(&c, &ev, req);
        prop_assert_eq!(v.boundary(), want, "maximality");

        let ok = usable(&c, &ev);
        // Exactly the non-usable records are reported.
        let reported: Vec<usize> = v.excluded.iter().map(|e| e.index).collect();
        let unusable: Vec<usize> = (0..ev.len()).filter(|&i| ok[i].is_none()).collect();
        prop_assert_eq!(reported, unusable);

        if let Outcome::Restore(p) = &v.outcome {
            prop_assert!(p.boundary > origin && p.boundary <= req.end);
            let slots: usize = c.groups().iter().map(|g| g.ranks.slots() as usize).sum();
            prop_assert_eq!(p.loads.len(), slots);
            for load in &p.loads {
                let (gi, g) = c.groups().iter().enumerate().find(|(_, g)| g.group == load.group).unwrap();
                let slot = g.ranks.slot_of(load.rank).unwrap();
                prop_assert!(!load.records.is_empty());
                for &i in &load.records {
                    prop_assert_eq!(ok[i], Some((gi, slot)), "listed record is not usable");
                }
                let rs: Vec<TokenRange> = load.records.iter().map(|&i| ev[i].range).collect();
                prop_assert_eq!(rs.last().unwrap().end(), p.boundary);
                for w in rs.windows(2) {
                    prop_assert_eq!(w[0].end(), w[1].start(), "not contiguous");
                }
                match g.rule {
                    Rule::Checkpoint { .. } => prop_assert_eq!(rs.len(), 1),
                    _ => {
                        let lower = lower_bound(g, origin, p.boundary);
                        prop_assert!(rs[0].start() <= lower, "does not reach back to {}", lower);
                        // Exactly what is needed: the first record is needed.
                        prop_assert!(rs[0].end() > lower);
                    }
                }
            }
        }
    }
}

#[test]
fn ranks_must_agree_on_one_boundary() {
    let g = group(0, Rule::Prefix, 4, Ranks::Sharded(2));
    let c = contract(vec![g.clone()]);
    let mut ev = pages(&g, 0, 16);
    // Rank 1 lacks its last page: the boundary is where both ranks are complete.
    ev.retain(|r| !(r.rank == RankSpec::Rank(1) && r.range.start() == 12));
    let v = validate(&c, RestoreRequest { origin: 0, end: 16 }, &ev);
    assert_eq!(v.boundary(), Some(12));
}
