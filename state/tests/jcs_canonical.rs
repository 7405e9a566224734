//! RFC 8785 canonicalization: formatting-independent, idempotent, numbers round-trip.

use orbitkv_state::jcs;
use proptest::prelude::*;
use serde_json::Value;

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Value::from),
        "\\PC{0,8}".prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 32, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map("\\PC{0,6}", inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

proptest! {
    #[test]
    fn compact_and_pretty_renderings_agree(v in json_value()) {
        let compact = serde_json::to_vec(&v).unwrap();
        let pretty = serde_json::to_vec_pretty(&v).unwrap();
        let a = jcs::canonicalize(&compact).unwrap();
        let b = jcs::canonicalize(&pretty).unwrap();
        prop_assert_eq!(&a, &b);
        prop_assert_eq!(jcs::canonicalize(&a).unwrap(), a);
    }

    #[test]
    fn numbers_round_trip(bits in any::<u64>()) {
        let f = f64::from_bits(bits);
        prop_assume!(f.is_finite());
        let text = jcs::format_number(f);
        let back: f64 = text.parse().unwrap();
        prop_assert!(back == f || (f == 0.0 && back == 0.0), "{} -> {}", f, text);
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..64)) {
        let _ = jcs::canonicalize(&bytes);
    }
}
