//! Each typed `Recompute` reason, and how disagreeing records shrink the boundary instead of
//! being used.

mod common;

use common::*;
use orbitkv_state::{
    CacheGroupId, Component, Disagreement, Namespace, Outcome, RankSpec, Ranks, Recompute,
    RestoreRequest, Rule, StateKey, validate,
};

fn req(origin: u64, end: u64) -> RestoreRequest {
    RestoreRequest { origin, end }
}

fn reason(v: &orbitkv_state::Validation) -> Recompute {
    match v.outcome {
        Outcome::Recompute(r) => r,
        Outcome::Restore(ref p) => panic!("unexpected restore at {}", p.boundary),
    }
}

#[test]
fn hybrid_model_restores_largest_common_boundary() {
    // Dense 16-token pages, a 40-token window, and SSM checkpoints every 64 tokens; 2 ranks.
    let dense = group(0, Rule::Prefix, 16, Ranks::Sharded(2));
    let window = group(1, Rule::Window { tokens: 40 }, 16, Ranks::Sharded(2));
    let ssm = group(2, Rule::Checkpoint { grid: 64 }, 16, Ranks::Sharded(2));
    let c = contract(vec![dense.clone(), window.clone(), ssm.clone()]);
    let mut ev = pages(&dense, 0, 256);
    ev.extend(pages(&window, 128, 256)); // only the tail of the window group is kept
    for rank in [RankSpec::Rank(0), RankSpec::Rank(1)] {
        for b in [64, 128, 192] {
            ev.push(record(&ssm, rank, b - 64, b, 0));
        }
    }
    let v = validate(&c, req(0, 250), &ev);
    let Outcome::Restore(p) = &v.outcome else {
        panic!("{:?}", v.outcome)
    };
    assert_eq!(p.boundary, 192);
    assert!(v.excluded.is_empty());
    // Window at 192 needs [192 - round_up(39, 16), 192) = [144, 192): three pages per rank.
    let w = p.loads.iter().find(|l| l.group == CacheGroupId(1)).unwrap();
    assert_eq!(w.records.len(), 3);
    assert_eq!(ev[w.records[0]].range.start(), 144);
    let d = p.loads.iter().find(|l| l.group == CacheGroupId(0)).unwrap();
    assert_eq!(d.records.len(), 12);
    let s = p.loads.iter().find(|l| l.group == CacheGroupId(2)).unwrap();
    assert_eq!(s.records.len(), 1);
}

#[test]
fn origin_is_absolute_and_pages_before_it_count_as_present() {
    let g = group(0, Rule::Prefix, 4, Ranks::Sharded(1));
    let c = contract(vec![g.clone()]);
    let ev = pages(&g, 8, 20); // nothing before token 8
    assert_eq!(validate(&c, req(8, 20), &ev).boundary(), Some(20));
    // From origin 0 the first pages are missing: a gap at 0, never renumbered.
    assert_eq!(
        reason(&validate(&c, req(0, 20), &ev)),
        Recompute::Gap {
            group: CacheGroupId(0),
            rank: RankSpec::Rank(0),
            at: 0
        }
    );
    // An unaligned origin inside a page is covered by that page.
    assert_eq!(validate(&c, req(10, 20), &ev).boundary(), Some(20));
}

#[test]
fn disagreeing_record_shrinks_boundary_and_is_reported() {
    let g = group(0, Rule::Prefix, 4, Ranks::Sharded(1));
    let c = contract(vec![g.clone()]);
    let mut ev = pages(&g, 0, 16);
    ev[2].format = format_digest(5, 5);
    let v = validate(&c, req(0, 16), &ev);
    assert_eq!(v.boundary(), Some(8));
    assert_eq!(v.excluded.len(), 1);
    assert_eq!(v.excluded[0].index, 2);
    assert_eq!(v.excluded[0].reason, Disagreement::Format);

    let mut ev = pages(&g, 0, 16);
    ev[1].key = StateKey::new(
        Namespace([7; 32]),
        DOMAIN,
        ev[1].key.hash.native(),
        ev[1].group,
        ev[1].component,
        ev[1].rank,
    )
    .unwrap();
    let v = validate(&c, req(0, 16), &ev);
    assert_eq!(v.boundary(), Some(4));
    assert_eq!(v.excluded[0].reason, Disagreement::Namespace);

    let mut ev = pages(&g, 0, 16);
    ev[0].component = Component::Mla;
    let v = validate(&c, req(0, 16), &ev);
    assert_eq!(v.excluded[0].reason, Disagreement::Component);
    assert!(v.boundary().is_none());
}

#[test]
fn duplicates_and_overlaps_are_never_used() {
    let g = group(0, Rule::Prefix, 4, Ranks::Sharded(1));
    let c = contract(vec![g.clone()]);
    let mut ev = pages(&g, 0, 16);
    ev.push(record(&g, RankSpec::Rank(0), 0, 4, 9)); // same range, another key
    let v = validate(&c, req(0, 16), &ev);
    assert_eq!(
        reason(&v),
        Recompute::Duplicate {
            group: CacheGroupId(0),
            rank: RankSpec::Rank(0),
            at: 0
        }
    );
    assert_eq!(v.excluded.len(), 2);
    assert!(matches!(
        v.excluded[0].reason,
        Disagreement::Duplicate { with: 4 }
    ));

    let mut ev = pages(&g, 0, 16);
    ev.push(record(&g, RankSpec::Rank(0), 8, 10, 9)); // partial page overlapping page 2
    let v = validate(&c, req(0, 16), &ev);
    assert_eq!(v.boundary(), Some(8));
    let v = validate(&c, req(8, 16), &ev);
    assert_eq!(
        reason(&v),
        Recompute::Overlap {
            group: CacheGroupId(0),
            rank: RankSpec::Rank(0),
            at: 8
        }
    );
}

#[test]
fn missing_rank_unsupported_and_empty_requests() {
    let g = group(0, Rule::Prefix, 4, Ranks::Sharded(2));
    let c = contract(vec![g.clone()]);
    let ev: Vec<_> = pages(&g, 0, 16)
        .into_iter()
        .filter(|r| r.rank == RankSpec::Rank(0))
        .collect();
    assert_eq!(
        reason(&validate(&c, req(0, 16), &ev)),
        Recompute::MissingRank {
            group: CacheGroupId(0),
            rank: RankSpec::Rank(1)
        }
    );
    assert_eq!(
        reason(&validate(&c, req(5, 5), &ev)),
        Recompute::NothingBeyondOrigin
    );
    let dsa = group(1, Rule::Undefined, 4, Ranks::Sharded(2));
    let c2 = contract(vec![g.clone(), dsa]);
    assert_eq!(
        reason(&validate(&c2, req(0, 16), &pages(&g, 0, 16))),
        Recompute::UnsupportedComponent {
            group: CacheGroupId(1),
            component: Component::DsaIndexer
        }
    );
}

#[test]
fn checkpoint_and_window_reasons() {
    let dense = group(0, Rule::Prefix, 4, Ranks::Sharded(1));
    let ssm = group(1, Rule::Checkpoint { grid: 8 }, 4, Ranks::Sharded(1));
    let c = contract(vec![dense.clone(), ssm.clone()]);
    let mut ev = pages(&dense, 0, 20);
    // A checkpoint at 16 exists; at 20 (end) there is none: B = 16, not 20.
    ev.push(record(&ssm, RankSpec::Rank(0), 8, 16, 0));
    assert_eq!(validate(&c, req(0, 20), &ev).boundary(), Some(16));
    // A checkpoint that does not span one grid cell is misaligned, hence absent.
    let mut ev2 = pages(&dense, 0, 20);
    ev2.push(record(&ssm, RankSpec::Rank(0), 12, 16, 0));
    let v = validate(&c, req(0, 20), &ev2);
    assert_eq!(
        reason(&v),
        Recompute::NoCheckpoint {
            group: CacheGroupId(1),
            rank: RankSpec::Rank(0)
        }
    );
    assert_eq!(v.excluded[0].reason, Disagreement::Misaligned);
    // Checkpoint at 8 but dense pages only up to 4: no common boundary.
    let mut ev3 = pages(&dense, 0, 4);
    ev3.extend(pages(&dense, 12, 16));
    ev3.push(record(&ssm, RankSpec::Rank(0), 0, 8, 0));
    assert_eq!(
        reason(&validate(&c, req(0, 16), &ev3)),
        Recompute::NoCommonBoundary
    );

    let win = group(0, Rule::Window { tokens: 9 }, 4, Ranks::Sharded(1));
    let c = contract(vec![win.clone()]);
    // Window 9 needs round_up(8, 4) = 8 tokens before B: pages [8,12) and [12,16) for B = 16.
    let ev = pages(&win, 12, 16);
    assert_eq!(
        reason(&validate(&c, req(0, 16), &ev)),
        Recompute::WindowIncomplete {
            group: CacheGroupId(0),
            rank: RankSpec::Rank(0)
        }
    );
    assert_eq!(
        validate(&c, req(0, 16), &pages(&win, 8, 16)).boundary(),
        Some(16)
    );
    // Pages before the origin are present: origin 12 needs only [12, 16).
    assert_eq!(validate(&c, req(12, 16), &ev).boundary(), Some(16));
}

#[test]
fn replicated_groups_take_one_record_per_page() {
    let mla = group(0, Rule::Prefix, 4, Ranks::Replicated);
    let c = contract(vec![mla.clone()]);
    let ev = pages(&mla, 0, 8);
    let v = validate(&c, req(0, 8), &ev);
    assert_eq!(v.boundary(), Some(8));
    // A per-rank record in a replicated group disagrees.
    let bad = record(&mla, RankSpec::Rank(0), 0, 4, 0);
    let v = validate(&c, req(0, 8), &[bad]);
    assert_eq!(v.excluded[0].reason, Disagreement::Rank);
}

#[test]
fn ambiguity_is_named_for_every_rule_and_not_taken_for_a_missing_rank() {
    // Rank 1's only page is duplicated: a duplicate, not a missing rank.
    let g = group(0, Rule::Prefix, 4, Ranks::Sharded(2));
    let c = contract(vec![g.clone()]);
    let ev = vec![
        record(&g, RankSpec::Rank(0), 0, 4, 0),
        record(&g, RankSpec::Rank(1), 0, 4, 0),
        record(&g, RankSpec::Rank(1), 0, 4, 1),
    ];
    assert_eq!(
        reason(&validate(&c, req(0, 4), &ev)),
        Recompute::Duplicate {
            group: CacheGroupId(0),
            rank: RankSpec::Rank(1),
            at: 0
        }
    );
    // Duplicate checkpoints at the only boundary.
    let ssm = group(0, Rule::Checkpoint { grid: 8 }, 4, Ranks::Sharded(1));
    let c = contract(vec![ssm.clone()]);
    let ev = vec![
        record(&ssm, RankSpec::Rank(0), 0, 8, 0),
        record(&ssm, RankSpec::Rank(0), 0, 8, 1),
    ];
    assert_eq!(
        reason(&validate(&c, req(0, 8), &ev)),
        Recompute::Duplicate {
            group: CacheGroupId(0),
            rank: RankSpec::Rank(0),
            at: 0
        }
    );
    // Overlapping window pages.
    let win = group(0, Rule::Window { tokens: 4 }, 4, Ranks::Sharded(1));
    let c = contract(vec![win.clone()]);
    let ev = vec![
        record(&win, RankSpec::Rank(0), 0, 4, 0),
        record(&win, RankSpec::Rank(0), 0, 2, 1),
    ];
    assert!(matches!(
        reason(&validate(&c, req(0, 4), &ev)),
        Recompute::Overlap { at: 0, .. }
    ));
}

#[test]
fn a_page_running_past_the_request_is_not_a_gap() {
    let g = group(0, Rule::Prefix, 16, Ranks::Sharded(1));
    let c = contract(vec![g.clone()]);
    let ev = pages(&g, 0, 32);
    assert_eq!(
        reason(&validate(&c, req(16, 20), &ev)),
        Recompute::PastEnd {
            group: CacheGroupId(0),
            rank: RankSpec::Rank(0),
            at: 16
        }
    );
}

#[test]
fn disagreements_of_every_kind_are_reported() {
    let g = group(0, Rule::Prefix, 4, Ranks::Sharded(2));
    let c = contract(vec![g.clone()]);
    let base = record(&g, RankSpec::Rank(0), 0, 4, 0);
    let rekey =
        |r: &orbitkv_state::RecordEvidence, domain: orbitkv_state::HashDomain, gid: u32, rank| {
            StateKey::new(
                NS,
                domain,
                &r.key.hash.native()[..domain.native_len()],
                CacheGroupId(gid),
                r.component,
                rank,
            )
            .unwrap()
        };
    let mut domain = base.clone();
    domain.key = rekey(
        &base,
        orbitkv_state::HashDomain::SglangSha256,
        0,
        RankSpec::Rank(0),
    );
    let mut unknown = base.clone();
    unknown.group = CacheGroupId(9);
    unknown.key = rekey(&base, DOMAIN, 9, RankSpec::Rank(0));
    let mut rank = base.clone();
    rank.rank = RankSpec::Rank(2);
    rank.key = rekey(&base, DOMAIN, 0, RankSpec::Rank(2));
    let mut fields = base.clone();
    fields.key = rekey(&base, DOMAIN, 0, RankSpec::Rank(1));
    let mut misaligned = record(&g, RankSpec::Rank(0), 1, 5, 0);
    misaligned.format = base.format;
    let v = validate(&c, req(0, 4), &[domain, unknown, rank, fields, misaligned]);
    let reasons: Vec<Disagreement> = v.excluded.iter().map(|e| e.reason).collect();
    assert_eq!(
        reasons,
        [
            Disagreement::Domain,
            Disagreement::UnknownGroup,
            Disagreement::Rank,
            Disagreement::KeyFields,
            Disagreement::Misaligned
        ]
    );
}

#[test]
fn empty_contract_is_refused() {
    assert!(orbitkv_state::RecoveryContract::from_groups(NS, DOMAIN, vec![]).is_err());
}
