//! Changing any single identity field changes the identity; equal inputs give equal identities.

#![expect(
    clippy::unwrap_used,
    reason = "test code: a failed unwrap is a failed test"
)]

use orbitkv_state::{EngineKind, IdentityBuilder, Label, ModelDigest};
use proptest::prelude::*;

#[derive(Debug, Clone)]
struct Inputs {
    artifacts: [u8; 32],
    operator: bool,
    config_value: u32,
    engine: bool,
    release: String,
    dtype: String,
    quantization: String,
    kv_dtype: String,
    backend: String,
    variant: String,
    setting: Option<(String, Vec<u8>)>,
}

fn label() -> impl Strategy<Value = String> {
    "[a-z0-9_.]{1,12}"
}

fn inputs() -> impl Strategy<Value = Inputs> {
    (
        any::<[u8; 32]>(),
        any::<bool>(),
        any::<u32>(),
        any::<bool>(),
        (label(), label(), label(), label(), label(), label()),
        prop::option::of(("[a-z]{1,8}", prop::collection::vec(any::<u8>(), 0..8))),
    )
        .prop_map(
            |(artifacts, operator, config_value, engine, l, setting)| Inputs {
                artifacts,
                operator,
                config_value,
                engine,
                release: l.0,
                dtype: l.1,
                quantization: l.2,
                kv_dtype: l.3,
                backend: l.4,
                variant: l.5,
                setting,
            },
        )
}

fn build(i: &Inputs) -> String {
    let l = |v: &str| Label::new("t", v).unwrap();
    let digest = if i.operator {
        ModelDigest::Operator(i.artifacts)
    } else {
        ModelDigest::Artifacts(i.artifacts)
    };
    let config = format!(
        "{{\"model_type\":\"llama\",\"hidden_size\":{}}}",
        i.config_value
    );
    let mut b = IdentityBuilder::new()
        .model(digest)
        .model_config_json(config.as_bytes())
        .unwrap()
        .engine(
            if i.engine {
                EngineKind::Vllm
            } else {
                EngineKind::Sglang
            },
            l(&i.release),
        )
        .dtype(l(&i.dtype))
        .quantization(l(&i.quantization))
        .kv_cache_dtype(l(&i.kv_dtype))
        .attention_backend(l(&i.backend))
        .cache_variant(l(&i.variant));
    if let Some((name, value)) = &i.setting {
        b = b.setting(name, value).unwrap();
    }
    b.build().unwrap().to_string()
}

fn bump(s: &str) -> String {
    format!("{s}x")
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn any_single_field_change_changes_identity(i in inputs(), which in 0usize..12) {
        let base = build(&i);
        prop_assert_eq!(&base, &build(&i.clone()));
        let mut j = i.clone();
        match which {
            0 => j.artifacts[0] ^= 1,
            1 => j.operator = !j.operator,
            2 => j.config_value = j.config_value.wrapping_add(1),
            3 => j.engine = !j.engine,
            4 => j.release = bump(&j.release),
            5 => j.dtype = bump(&j.dtype),
            6 => j.quantization = bump(&j.quantization),
            7 => j.kv_dtype = bump(&j.kv_dtype),
            8 => j.backend = bump(&j.backend),
            9 => j.variant = bump(&j.variant),
            10 => j.setting = match j.setting {
                None => Some(("extra".into(), vec![])),
                Some(_) => None,
            },
            _ => j.setting = j.setting.map(|(n, mut v)| { v.push(0); (n, v) })
                .or(Some(("k".into(), vec![1]))),
        }
        prop_assert_ne!(base, build(&j));
    }

    /// Values never bleed between fields: moving a suffix from one field to the next changes
    /// the identity (the framing is unambiguous).
    #[test]
    fn framing_is_unambiguous(i in inputs()) {
        let mut j = i.clone();
        j.dtype = format!("{}{}", i.dtype, &i.quantization[..1]);
        j.quantization = if i.quantization.len() > 1 { i.quantization[1..].to_owned() } else { "q".into() };
        prop_assert_ne!(build(&i), build(&j));
    }
}
