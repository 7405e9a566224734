//! Validator cost for a 128k-token request with three groups (dense, 4096-token window, SSM
//! checkpoints every 256 tokens) of 16-token blocks on 2 ranks, as a ratio to a memcpy of the bytes
//! it proves (64 KiB per page), in the same run (target <= 0.01).

use std::hint::black_box;
use std::time::Instant;

use criterion::Criterion;
use orbitkv_benches::{Target, record, report};
use orbitkv_state::{
    CacheGroupId, Component, FormatDigest, GroupContract, HashDomain, Namespace, Outcome, RankSpec,
    Ranks, RecordEvidence, RecoveryContract, RestoreRequest, Rule, StateKey, TokenRange, validate,
};

const TOKENS: u64 = 128 * 1024;
const BLOCK: u64 = 16;
const RANKS: u32 = 2;
const PAGE_BYTES: usize = 64 * 1024;
const NS: Namespace = Namespace([3; 32]);
const DOMAIN: HashDomain = HashDomain::VllmSha256Cbor;

fn group(id: u32, component: Component, rule: Rule) -> GroupContract {
    GroupContract {
        group: CacheGroupId(id),
        component,
        rule,
        block_tokens: BLOCK,
        ranks: Ranks::Sharded(RANKS),
        formats: (0..RANKS)
            .map(|r| FormatDigest([(id * 8 + r) as u8; 32]))
            .collect(),
    }
}

fn rec(g: &GroupContract, rank: u32, start: u64, end: u64) -> Option<RecordEvidence> {
    let mut native = [0u8; 32];
    native[..8].copy_from_slice(&start.to_le_bytes());
    native[8..12].copy_from_slice(&g.group.0.to_le_bytes());
    let rank = RankSpec::Rank(rank);
    Some(RecordEvidence {
        key: StateKey::new(NS, DOMAIN, &native, g.group, g.component, rank).ok()?,
        range: TokenRange::new(start, end).ok()?,
        component: g.component,
        group: g.group,
        rank,
        format: g.formats[match rank {
            RankSpec::Rank(r) => r as usize,
            RankSpec::Replicated => 0,
        }],
    })
}

fn main() {
    let dense = group(0, Component::DenseKv, Rule::Prefix);
    let window = group(1, Component::SlidingWindowKv, Rule::Window { tokens: 4096 });
    let ssm = group(2, Component::SsmState, Rule::Checkpoint { grid: 256 });
    let Ok(contract) =
        RecoveryContract::from_groups(NS, DOMAIN, vec![dense.clone(), window.clone(), ssm.clone()])
    else {
        eprintln!("contract refused");
        return;
    };
    let mut evidence = Vec::new();
    for g in [&dense, &window] {
        for rank in 0..RANKS {
            let mut s = 0;
            while s < TOKENS {
                evidence.extend(rec(g, rank, s, s + BLOCK));
                s += BLOCK;
            }
        }
    }
    for rank in 0..RANKS {
        let mut e = 256;
        while e <= TOKENS {
            evidence.extend(rec(&ssm, rank, e - 256, e));
            e += 256;
        }
    }
    let request = RestoreRequest {
        origin: 0,
        end: TOKENS,
    };
    let v = validate(&contract, request, &evidence);
    let Outcome::Restore(proof) = &v.outcome else {
        eprintln!("expected a restore, got {:?}", v.outcome);
        return;
    };
    let proven: usize = proof.loads.iter().map(|l| l.records.len()).sum();
    let bytes = proven * PAGE_BYTES;
    println!(
        "validator: {} evidence records, boundary {}, {} records proven = {} MiB",
        evidence.len(),
        proof.boundary,
        proven,
        bytes >> 20
    );
    let src = vec![1u8; bytes];
    let mut dst = vec![0u8; bytes];

    let mut c = Criterion::default().sample_size(20).configure_from_args();
    let mut g = c.benchmark_group("validator_128k_3groups_2ranks");
    g.bench_function("validate", |b| {
        b.iter_custom(|iters| {
            let t = Instant::now();
            for _ in 0..iters {
                black_box(validate(&contract, request, black_box(&evidence)));
            }
            record("validate", iters, t.elapsed())
        })
    });
    g.bench_function("memcpy_proven_bytes", |b| {
        b.iter_custom(|iters| {
            let t = Instant::now();
            for _ in 0..iters {
                dst.copy_from_slice(black_box(&src));
                black_box(&mut dst);
            }
            record("memcpy", iters, t.elapsed())
        })
    });
    g.finish();
    c.final_summary();
    report(
        "validator time / memcpy of the proven bytes",
        "validate",
        "memcpy",
        true,
        Target::AtMost(0.01),
    );
}
