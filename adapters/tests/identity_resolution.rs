//! Identity resolution end to end: operator digest, config participation, hub snapshots, LoRA
//! refusal, and refusals for unusable inputs.

#![expect(
    clippy::unwrap_used,
    reason = "test code: a failed unwrap is a failed test"
)]

use std::ffi::OsString;
use std::fs;
use std::path::Path;

use orbitkv_adapters::Error;
use orbitkv_adapters::identity::{
    EngineSettings, FingerprintOptions, IdentityEnv, ModelSource, resolve,
};
use orbitkv_state::{EngineKind, Label, ModelDigest};

fn settings() -> EngineSettings {
    let l = |v: &str| Label::new("t", v).unwrap();
    EngineSettings {
        engine: EngineKind::Vllm,
        release: l("0.33.0"),
        dtype: l("bfloat16"),
        kv_cache_dtype: l("bfloat16"),
        quantization: l("none"),
        attention_backend: l("FLASH_ATTN"),
        cache_variant: l("paged"),
        settings: vec![],
        lora_active: false,
    }
}

fn model(dir: &Path, config: &str) {
    fs::create_dir_all(dir).unwrap();
    fs::write(dir.join("config.json"), config).unwrap();
    fs::write(dir.join("model.safetensors"), [1u8; 64]).unwrap();
}

fn id(dir: &Path, env: &IdentityEnv) -> Result<String, Error> {
    resolve(
        &ModelSource::Dir(dir.to_owned()),
        &settings(),
        env,
        &FingerprintOptions::default(),
    )
    .map(|r| r.identity.to_string())
}

#[test]
fn operator_digest_skips_artifacts_but_config_still_counts() {
    let a = tempfile::tempdir().unwrap();
    model(a.path(), r#"{"hidden_size": 8}"#);
    let env = IdentityEnv::parse(Some(OsString::from("ab".repeat(32))), None).unwrap();
    let with_op = resolve(
        &ModelSource::Dir(a.path().to_owned()),
        &settings(),
        &env,
        &FingerprintOptions::default(),
    )
    .unwrap();
    assert!(matches!(with_op.model, ModelDigest::Operator(_)));
    assert!(with_op.files.is_empty() && with_op.hashed_bytes == 0);
    // Artifacts change: identity unchanged under the operator digest.
    fs::write(a.path().join("model.safetensors"), [2u8; 64]).unwrap();
    assert_eq!(id(a.path(), &env).unwrap(), with_op.identity.to_string());
    // Config change: identity changes even with the operator digest.
    fs::write(a.path().join("config.json"), r#"{"hidden_size": 9}"#).unwrap();
    assert_ne!(id(a.path(), &env).unwrap(), with_op.identity.to_string());
    // Config formatting does not matter (RFC 8785).
    fs::write(a.path().join("config.json"), "{ \"hidden_size\" : 8.0 }\n").unwrap();
    assert_eq!(id(a.path(), &env).unwrap(), with_op.identity.to_string());
}

#[test]
fn content_digest_differs_from_operator_digest() {
    let a = tempfile::tempdir().unwrap();
    model(a.path(), "{}");
    let by_content = id(a.path(), &IdentityEnv::default()).unwrap();
    let env = IdentityEnv::parse(Some(OsString::from("00".repeat(32))), None).unwrap();
    assert_ne!(by_content, id(a.path(), &env).unwrap());
}

#[test]
fn lora_is_refused() {
    let a = tempfile::tempdir().unwrap();
    model(a.path(), "{}");
    let mut s = settings();
    s.lora_active = true;
    let err = resolve(
        &ModelSource::Dir(a.path().to_owned()),
        &s,
        &IdentityEnv::default(),
        &FingerprintOptions::default(),
    )
    .unwrap_err();
    assert!(matches!(err, Error::Lora { .. }));
    fs::write(a.path().join("adapter_config.json"), "{}").unwrap();
    assert!(matches!(
        id(a.path(), &IdentityEnv::default()),
        Err(Error::Lora { .. })
    ));
}

#[test]
fn missing_or_bad_config_is_refused() {
    let a = tempfile::tempdir().unwrap();
    fs::write(a.path().join("model.safetensors"), [1u8; 8]).unwrap();
    assert!(matches!(
        id(a.path(), &IdentityEnv::default()),
        Err(Error::MissingConfig { .. })
    ));
    fs::write(a.path().join("config.json"), r#"{"a":1,"a":2}"#).unwrap();
    assert!(matches!(
        id(a.path(), &IdentityEnv::default()),
        Err(Error::State(_))
    ));
}

#[test]
fn hub_snapshot_resolves_only_full_commits_from_the_local_cache() {
    let cache = tempfile::tempdir().unwrap();
    let rev = "0123456789abcdef0123456789abcdef01234567";
    let snap = cache
        .path()
        .join("models--org--tiny")
        .join("snapshots")
        .join(rev);
    model(&snap, "{}");
    let hub_cache = || Ok(cache.path().to_owned());
    let src = ModelSource::from_arg("org/tiny", Some(rev), hub_cache).unwrap();
    let via_hub = resolve(
        &src,
        &settings(),
        &IdentityEnv::default(),
        &FingerprintOptions::default(),
    )
    .unwrap();
    assert_eq!(
        via_hub.identity.to_string(),
        id(&snap, &IdentityEnv::default()).unwrap()
    );

    let hub_cache = || Ok(cache.path().to_owned());
    assert!(matches!(
        ModelSource::from_arg("org/tiny", Some("main"), hub_cache),
        Err(Error::HubRevision { .. })
    ));
    let hub_cache = || Ok(cache.path().to_owned());
    assert!(matches!(
        ModelSource::from_arg("org/tiny", None, hub_cache),
        Err(Error::HubRevisionMissing { .. })
    ));
    let other = "1123456789abcdef0123456789abcdef01234567";
    let hub_cache = || Ok(cache.path().to_owned());
    let missing = ModelSource::from_arg("org/tiny", Some(other), hub_cache).unwrap();
    assert!(matches!(
        missing.directory(),
        Err(Error::HubSnapshotMissing { .. })
    ));
    assert!(matches!(
        ModelSource::from_arg("not a model", None, || Ok(cache.path().to_owned())),
        Err(Error::UnknownModel(_))
    ));
}

#[test]
fn model_argument_errors_say_what_is_wrong() {
    let a = tempfile::tempdir().unwrap();
    model(a.path(), "{}");
    let file = a.path().join("config.json");
    let no_cache = || -> Result<std::path::PathBuf, Error> { Err(Error::NoHubCache) };
    assert!(matches!(
        ModelSource::from_arg(file.to_str().unwrap(), None, no_cache),
        Err(Error::NotADirectory { .. })
    ));
    let err = ModelSource::from_arg("models/llama", None, no_cache).unwrap_err();
    assert!(err.to_string().contains("no such directory"), "{err}");
    assert!(matches!(
        ModelSource::from_arg(a.path().to_str().unwrap(), Some("main"), no_cache),
        Err(Error::HubRepo { .. })
    ));
}
