//! StateKey encode/decode: round trips, and every malformed input is refused with a typed error.

#![expect(
    clippy::unwrap_used,
    reason = "test code: a failed unwrap is a failed test"
)]

use orbitkv_state::{
    CacheGroupId, Component, Error, HashDomain, KeyHash, Namespace, RankSpec, StateKey,
};
use proptest::prelude::*;

fn key_strategy() -> impl Strategy<Value = StateKey> {
    (
        any::<[u8; 32]>(),
        0usize..4,
        any::<[u8; 32]>(),
        any::<u32>(),
        0usize..8,
        prop_oneof![
            Just(RankSpec::Replicated),
            (0u32..1024).prop_map(RankSpec::Rank)
        ],
    )
        .prop_map(|(ns, d, native, group, c, rank)| {
            let domain = HashDomain::ALL[d];
            StateKey::new(
                Namespace(ns),
                domain,
                &native[..domain.native_len()],
                CacheGroupId(group),
                Component::ALL[c],
                rank,
            )
            .unwrap()
        })
}

proptest! {
    #[test]
    fn round_trip(k in key_strategy()) {
        let bytes = k.encode();
        let d = StateKey::decode(&bytes).unwrap();
        prop_assert_eq!(d, k);
        prop_assert_eq!(d.encode(), bytes);
    }

    #[test]
    fn every_truncation_and_extension_refused(k in key_strategy(), extra in 1usize..4) {
        let bytes = k.encode();
        for cut in 0..bytes.len() {
            prop_assert!(StateKey::decode(&bytes[..cut]).is_err(), "cut at {}", cut);
        }
        let mut longer = bytes.clone();
        longer.extend(std::iter::repeat_n(0u8, extra));
        let is_trailing = matches!(StateKey::decode(&longer), Err(Error::TrailingBytes { .. }));
        prop_assert!(is_trailing);
    }

    /// Any byte change either is refused or decodes to a key that re-encodes to exactly those
    /// bytes (so it is a different key, never a silent alias).
    #[test]
    fn mutations_refused_or_canonical(k in key_strategy(), pos in any::<prop::sample::Index>(), x in 1u8..=255) {
        let mut bytes = k.encode();
        let p = pos.index(bytes.len());
        bytes[p] ^= x;
        if let Ok(d) = StateKey::decode(&bytes) {
            prop_assert_eq!(d.encode(), bytes);
            prop_assert_ne!(d, k);
        }
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..96)) {
        let _ = StateKey::decode(&bytes);
        let _ = KeyHash::decode(&bytes);
    }
}

#[test]
fn typed_errors_for_each_field() {
    let k = StateKey::new(
        Namespace([0; 32]),
        HashDomain::SglangSha256,
        &[1; 32],
        CacheGroupId(0),
        Component::DenseKv,
        RankSpec::Rank(0),
    )
    .unwrap();
    let good = k.encode();
    let mut v = good.clone();
    v[32] = 2;
    assert!(matches!(
        StateKey::decode(&v),
        Err(Error::UnsupportedVersion { version: 2, .. })
    ));
    let mut d = good.clone();
    d[33] = 9;
    assert!(matches!(
        StateKey::decode(&d),
        Err(Error::UnknownCode {
            what: "hash domain",
            code: 9
        })
    ));
    let mut l = good.clone();
    l[34] = 16;
    assert!(matches!(
        StateKey::decode(&l),
        Err(Error::InvalidLength { .. })
    ));
    let mut c = good.clone();
    c[32 + 3 + 32 + 4] = 0;
    assert!(matches!(
        StateKey::decode(&c),
        Err(Error::UnknownCode {
            what: "component",
            code: 0
        })
    ));
}
