//! The validator on arbitrary contracts and evidence: never panics, and every proof it returns is
//! sound (each load is contiguous, ends at the boundary, and uses only agreeing records).
#![no_main]

use libfuzzer_sys::fuzz_target;
use orbitkv_state::{
    CacheGroupId, Component, FormatDigest, GroupContract, HashDomain, Namespace, Outcome, RankSpec,
    Ranks, RecordEvidence, RecoveryContract, RestoreRequest, Rule, StateKey, TokenRange, validate,
};

struct Bytes<'a>(&'a [u8]);

impl Bytes<'_> {
    fn u8(&mut self) -> u8 {
        match self.0.split_first() {
            Some((b, rest)) => {
                self.0 = rest;
                *b
            }
            None => 0,
        }
    }
    fn u16(&mut self) -> u64 {
        u64::from(self.u8()) | (u64::from(self.u8()) << 8)
    }
}

fuzz_target!(|data: &[u8]| {
    let mut b = Bytes(data);
    let ns = Namespace([1; 32]);
    let ngroups = 1 + b.u8() % 3;
    let mut groups = Vec::new();
    for id in 0..u32::from(ngroups) {
        let block = 1 + u64::from(b.u8() % 8);
        let (rule, component) = match b.u8() % 4 {
            0 => (Rule::Prefix, Component::DenseKv),
            1 => (
                Rule::Window {
                    tokens: 2 + b.u16() % 64,
                },
                Component::SlidingWindowKv,
            ),
            2 => (
                Rule::Checkpoint {
                    grid: 1 + b.u16() % 64,
                },
                Component::ConvState,
            ),
            _ => (Rule::Prefix, Component::Mla),
        };
        let ranks = if b.u8() % 4 == 0 {
            Ranks::Replicated
        } else {
            Ranks::Sharded(1 + u32::from(b.u8() % 3))
        };
        groups.push(GroupContract {
            group: CacheGroupId(id),
            component,
            rule,
            block_tokens: block,
            ranks,
            formats: (0..ranks.slots())
                .map(|s| FormatDigest([(id * 4 + s) as u8; 32]))
                .collect(),
        });
    }
    let Ok(contract) = RecoveryContract::from_groups(ns, HashDomain::SglangSha256, groups.clone())
    else {
        return;
    };
    let mut evidence = Vec::new();
    while !b.0.is_empty() && evidence.len() < 256 {
        let g = &groups[usize::from(b.u8()) % groups.len()];
        let rank = match b.u8() % 5 {
            4 => RankSpec::Replicated,
            r => RankSpec::Rank(u32::from(r)),
        };
        let start = b.u16();
        let len = 1 + b.u16() % 80;
        let Ok(range) = TokenRange::new(start, start + len) else {
            continue;
        };
        let format = FormatDigest([b.u8() % 16; 32]);
        let native = [b.u8(); 32];
        let Ok(key) = StateKey::new(
            ns,
            HashDomain::SglangSha256,
            &native,
            g.group,
            g.component,
            rank,
        ) else {
            continue;
        };
        evidence.push(RecordEvidence {
            key,
            range,
            component: g.component,
            group: g.group,
            rank,
            format,
        });
    }
    let origin = b.u16();
    let request = RestoreRequest {
        origin,
        end: origin + b.u16(),
    };
    let v = validate(&contract, request, &evidence);
    let excluded: Vec<usize> = v.excluded.iter().map(|e| e.index).collect();
    if let Outcome::Restore(p) = &v.outcome {
        assert!(p.boundary > request.origin && p.boundary <= request.end);
        for load in &p.loads {
            let recs: Vec<&RecordEvidence> = load.records.iter().map(|&i| &evidence[i]).collect();
            assert!(!recs.is_empty());
            assert_eq!(recs[recs.len() - 1].range.end(), p.boundary);
            for w in recs.windows(2) {
                assert_eq!(w[0].range.end(), w[1].range.start());
            }
            for &i in &load.records {
                assert!(!excluded.contains(&i));
                assert_eq!(evidence[i].group, load.group);
                assert_eq!(evidence[i].rank, load.rank);
            }
        }
    }
});
