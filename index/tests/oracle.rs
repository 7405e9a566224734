//! The index against a `HashMap` oracle: inserts (newer sequence wins), conditional and
//! unconditional removals, retirements below a watermark, probes, across table rebuilds.

#![expect(
    clippy::unwrap_used,
    reason = "test code: a failed unwrap is a failed test"
)]

use std::collections::HashMap;

use orbitkv_index::{Index, Insert, Record, Tier};
use orbitkv_state::{
    CacheGroupId, Component, FormatDigest, HashDomain, Namespace, RankSpec, StateKey, TokenRange,
};
use proptest::prelude::*;

fn key(ns: u8, i: u16) -> StateKey {
    let mut native = [0u8; 32];
    // Spread the hash bits so keys land in different shards and slots, but collide often
    // enough within a shard to exercise probing and tombstones.
    let h = u64::from(i).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ u64::from(ns);
    native[..8].copy_from_slice(&h.to_le_bytes());
    native[8..16].copy_from_slice(&h.rotate_left(17).to_le_bytes());
    native[30] = i as u8;
    StateKey::new(
        Namespace([ns; 32]),
        HashDomain::VllmSha256Cbor,
        &native,
        CacheGroupId(u32::from(i % 2)),
        Component::DenseKv,
        RankSpec::Rank(u32::from(ns % 2)),
    )
    .unwrap()
}

fn record(seq: u64, i: u16) -> Record {
    Record {
        tier: if seq.is_multiple_of(2) {
            Tier::Ssd
        } else {
            Tier::Dram
        },
        segment: (seq % 7) as u32,
        offset: seq * 8,
        stored_len: (seq % 1000) as u32,
        range: TokenRange::new(u64::from(i) * 16, u64::from(i) * 16 + 16).unwrap(),
        sequence: seq,
        format: FormatDigest([0x5a; 32]),
    }
}

#[derive(Debug, Clone)]
enum Op {
    Insert(u8, u16, u64),
    Remove(u8, u16),
    RemoveIf(u8, u16, u64),
    Retire(u8, u64),
    Probe(u8, u16, u16),
}

fn op() -> impl Strategy<Value = Op> {
    let ns = 0u8..3;
    let k = 0u16..300;
    prop_oneof![
        6 => (ns.clone(), k.clone(), 0u64..2000).prop_map(|(n, i, s)| Op::Insert(n, i, s)),
        2 => (ns.clone(), k.clone()).prop_map(|(n, i)| Op::Remove(n, i)),
        1 => (ns.clone(), k.clone(), 0u64..2000).prop_map(|(n, i, s)| Op::RemoveIf(n, i, s)),
        1 => (ns.clone(), 0u64..2000).prop_map(|(n, w)| Op::Retire(n, w)),
        1 => (ns, k.clone(), 1u16..20).prop_map(|(n, i, l)| Op::Probe(n, i, l)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn index_matches_hashmap(ops in prop::collection::vec(op(), 1..600), hint in prop_oneof![Just(0usize), Just(5000)]) {
        let index = Index::with_capacity(hint);
        let mut oracle: HashMap<StateKey, Record> = HashMap::new();
        for op in ops {
            match op {
                Op::Insert(n, i, s) => {
                    let k = key(n, i);
                    let r = record(s, i);
                    let got = index.insert(&k, r).unwrap();
                    match oracle.get(&k).copied() {
                        None => {
                            prop_assert_eq!(got, Insert::Inserted);
                            oracle.insert(k, r);
                        }
                        Some(cur) if cur.sequence >= s => {
                            prop_assert_eq!(got, Insert::Kept { current: cur });
                        }
                        Some(cur) => {
                            prop_assert_eq!(got, Insert::Replaced { previous: cur });
                            oracle.insert(k, r);
                        }
                    }
                }
                Op::Remove(n, i) => {
                    let k = key(n, i);
                    prop_assert_eq!(index.remove(&k, None), oracle.remove(&k));
                }
                Op::RemoveIf(n, i, s) => {
                    let k = key(n, i);
                    let want = match oracle.get(&k) {
                        Some(r) if r.sequence == s => oracle.remove(&k),
                        _ => None,
                    };
                    prop_assert_eq!(index.remove(&k, Some(s)), want);
                }
                Op::Retire(n, w) => {
                    let ns = Namespace([n; 32]);
                    let before = oracle.len();
                    oracle.retain(|k, r| k.namespace != ns || r.sequence >= w);
                    prop_assert_eq!(index.retire(&ns, w), before - oracle.len());
                }
                Op::Probe(n, i, l) => {
                    let chain: Vec<StateKey> = (i..i + l).map(|j| key(n, j)).collect();
                    let want = chain.iter().take_while(|k| oracle.contains_key(k)).count();
                    prop_assert_eq!(index.probe(&chain), want);
                }
            }
            prop_assert_eq!(index.len(), oracle.len());
        }
        for (k, r) in &oracle {
            prop_assert_eq!(index.get(k), Some(*r));
        }
        for n in 0..3u8 {
            for i in 0..300u16 {
                let k = key(n, i);
                prop_assert_eq!(index.get(&k), oracle.get(&k).copied());
            }
        }
    }
}

#[test]
fn formats_are_fixed_per_class_and_bounds_are_refused() {
    let index = Index::new();
    let k = key(1, 1);
    index.insert(&k, record(1, 1)).unwrap();
    let mut other = record(2, 1);
    other.format = FormatDigest([1; 32]);
    assert!(index.insert(&k, other).is_err());
    let mut far = record(3, 1);
    far.offset = orbitkv_index::MAX_OFFSET + 8;
    assert!(index.insert(&k, far).is_err());
    let mut odd = record(3, 1);
    odd.offset = 12;
    assert!(index.insert(&k, odd).is_err());
    let mut long = record(3, 1);
    long.range = TokenRange::new(1 << 40, (1 << 40) + 1).unwrap();
    assert!(index.insert(&k, long).is_err());
    assert_eq!(index.get(&k), Some(record(1, 1)));
}

#[test]
fn bytes_per_entry_with_a_capacity_hint() {
    let n = 200_000usize;
    let index = Index::with_capacity(n);
    for i in 0..n as u64 {
        let mut native = [0u8; 32];
        let h = i.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        native[..8].copy_from_slice(&h.to_le_bytes());
        native[8..16].copy_from_slice(&h.rotate_left(29).to_le_bytes());
        native[16..24].copy_from_slice(&i.to_le_bytes());
        let k = StateKey::new(
            Namespace([7; 32]),
            HashDomain::SglangSha256,
            &native,
            CacheGroupId(0),
            Component::DenseKv,
            RankSpec::Rank(0),
        )
        .unwrap();
        index.insert(&k, record(i + 1, 1)).unwrap();
    }
    assert_eq!(index.len(), n);
    let per_entry = index.memory_bytes() as f64 / n as f64;
    assert!(per_entry <= 100.0, "{per_entry:.1} bytes per entry");
}
