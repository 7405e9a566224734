//! `ComputationIdentity`: the name of the model computation whose KV state a record holds.
//!
//! A versioned, domain-separated SHA-256 over a fixed, documented list of named fields (see
//! docs/format.md, "Computation identity"). The builder has no defaults and fails closed: every
//! required field must be set, or `build` names all that are missing.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use crate::codec::{Writer, len_u32, sha256};
use crate::error::{Error, Result};
use crate::hex;
use crate::jcs;
use crate::label::Label;

/// Current identity encoding version; the `v1:` of the displayed form.
pub const IDENTITY_VERSION: u32 = 1;
/// Domain tag hashed before the fields, so no other OrbitKV digest can collide with an identity.
pub const IDENTITY_DOMAIN: &str = "orbitkv.computation-identity";

/// The engine that computes the state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum EngineKind {
    /// vLLM.
    Vllm,
    /// SGLang.
    Sglang,
}

impl EngineKind {
    /// Lowercase name as written into identities.
    pub const fn name(self) -> &'static str {
        match self {
            EngineKind::Vllm => "vllm",
            EngineKind::Sglang => "sglang",
        }
    }
}

impl FromStr for EngineKind {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "vllm" => Ok(EngineKind::Vllm),
            "sglang" => Ok(EngineKind::Sglang),
            other => Err(Error::InvalidField {
                field: "engine.kind",
                reason: format!("unknown engine {other:?} (expected vllm or sglang)"),
            }),
        }
    }
}

impl fmt::Display for EngineKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What names the model's artifacts: their content digest, or an operator's assertion.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ModelDigest {
    /// Digest of the artifact directory (weights, tokenizer, processor, model code), by content.
    Artifacts([u8; 32]),
    /// `ORBITKV_MODEL_FINGERPRINT`: an operator-supplied digest standing for all artifacts.
    Operator([u8; 32]),
}

impl ModelDigest {
    /// Parses an operator fingerprint: exactly 64 lowercase hex digits.
    pub fn operator_from_hex(text: &str) -> Result<Self> {
        if !hex::is_lower_hex(text, 64) {
            return Err(Error::InvalidField {
                field: "operator_digest",
                reason: "must be exactly 64 lowercase hex digits".to_owned(),
            });
        }
        Ok(ModelDigest::Operator(hex::decode_array(
            text,
            "operator_digest",
        )?))
    }
    fn field_name(self) -> &'static str {
        match self {
            ModelDigest::Artifacts(_) => "model.artifacts_digest",
            ModelDigest::Operator(_) => "model.operator_digest",
        }
    }
    /// The 32 digest bytes.
    pub fn bytes(&self) -> &[u8; 32] {
        match self {
            ModelDigest::Artifacts(d) | ModelDigest::Operator(d) => d,
        }
    }
}

/// One named field of the identity preimage, as it was hashed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdentityField {
    /// Field name (`model.config`, `engine.release`, ...).
    pub name: String,
    /// Value bytes exactly as hashed.
    pub value: Vec<u8>,
}

impl IdentityField {
    /// The value as text when it is UTF-8, else as hex (digests).
    pub fn display_value(&self) -> String {
        if self.name.ends_with("_digest") {
            return hex::encode(&self.value);
        }
        match std::str::from_utf8(&self.value) {
            Ok(s) => s.to_owned(),
            Err(_) => hex::encode(&self.value),
        }
    }
}

/// The computation identity: a SHA-256 digest, displayed as `v1:<64 lowercase hex>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ComputationIdentity {
    digest: [u8; 32],
}

impl ComputationIdentity {
    /// The digest bytes.
    pub const fn digest(&self) -> &[u8; 32] {
        &self.digest
    }
    /// Rebuilds an identity from its digest (as read back from a record or message).
    pub const fn from_digest(digest: [u8; 32]) -> Self {
        Self { digest }
    }
}

impl fmt::Display for ComputationIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "v{IDENTITY_VERSION}:{}", hex::encode(&self.digest))
    }
}

impl FromStr for ComputationIdentity {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        let Some(rest) = s.strip_prefix("v1:") else {
            return Err(Error::InvalidField {
                field: "computation identity",
                reason: "expected `v1:` followed by 64 lowercase hex digits".to_owned(),
            });
        };
        if !hex::is_lower_hex(rest, 64) {
            return Err(Error::InvalidField {
                field: "computation identity",
                reason: "expected `v1:` followed by 64 lowercase hex digits".to_owned(),
            });
        }
        Ok(Self {
            digest: hex::decode_array(rest, "computation identity")?,
        })
    }
}

/// Builds a [`ComputationIdentity`]. No field has a default.
#[derive(Debug, Clone, Default)]
pub struct IdentityBuilder {
    model: Option<ModelDigest>,
    model_config: Option<Vec<u8>>,
    engine: Option<EngineKind>,
    engine_release: Option<Label>,
    dtype: Option<Label>,
    quantization: Option<Label>,
    kv_cache_dtype: Option<Label>,
    attention_backend: Option<Label>,
    cache_variant: Option<Label>,
    extras: BTreeMap<String, Vec<u8>>,
    lora_active: bool,
}

impl IdentityBuilder {
    /// An empty builder.
    pub fn new() -> Self {
        Self::default()
    }
    /// The model artifacts' content digest, or the operator's digest.
    pub fn model(mut self, digest: ModelDigest) -> Self {
        self.model = Some(digest);
        self
    }
    /// The model configuration as JSON text; it is canonicalized (RFC 8785) before hashing.
    pub fn model_config_json(mut self, json: &[u8]) -> Result<Self> {
        let canonical = jcs::canonicalize(json).map_err(|e| Error::InvalidField {
            field: "model.config",
            reason: e.to_string(),
        })?;
        self.model_config = Some(canonical);
        Ok(self)
    }
    /// Engine kind and release (`vllm`, `0.33.0`).
    pub fn engine(mut self, kind: EngineKind, release: Label) -> Self {
        self.engine = Some(kind);
        self.engine_release = Some(release);
        self
    }
    /// Activation/weight dtype the engine computes in (`bfloat16`).
    pub fn dtype(mut self, v: Label) -> Self {
        self.dtype = Some(v);
        self
    }
    /// Weight quantization method; `none` when unquantized (it must still be stated).
    pub fn quantization(mut self, v: Label) -> Self {
        self.quantization = Some(v);
        self
    }
    /// KV-cache dtype as resolved by the engine (`bfloat16`, `fp8_e4m3`).
    pub fn kv_cache_dtype(mut self, v: Label) -> Self {
        self.kv_cache_dtype = Some(v);
        self
    }
    /// Attention backend (`FLASH_ATTN`, `flashinfer`, ...).
    pub fn attention_backend(mut self, v: Label) -> Self {
        self.attention_backend = Some(v);
        self
    }
    /// Cache representation variant (how the engine lays out and names its cache state).
    pub fn cache_variant(mut self, v: Label) -> Self {
        self.cache_variant = Some(v);
        self
    }
    /// Another computation setting that changes KV bytes (kernel config, overrides, hash seed, ...).
    /// Names are 1..=64 bytes of `[a-z0-9_.]`; setting one twice keeps the last value.
    pub fn setting(mut self, name: &str, value: &[u8]) -> Result<Self> {
        let ok = !name.is_empty()
            && name.len() <= 64
            && name
                .bytes()
                .all(|b| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'_' | b'.'));
        if !ok {
            return Err(Error::InvalidField {
                field: "setting",
                reason: format!("setting name {name:?} must be 1..=64 bytes of [a-z0-9_.]"),
            });
        }
        self.extras.insert(name.to_owned(), value.to_vec());
        Ok(self)
    }
    /// Declares whether a LoRA adapter is active; an active one makes `build` refuse.
    pub fn lora_active(mut self, active: bool) -> Self {
        self.lora_active = active;
        self
    }

    /// The fields in hashing order, or every missing one.
    pub fn fields(&self) -> Result<Vec<IdentityField>> {
        if self.lora_active {
            return Err(Error::UnsupportedLora);
        }
        let mut missing = Vec::new();
        if self.model.is_none() {
            missing.push("model artifacts digest or operator digest");
        }
        let required: [(&'static str, Option<&[u8]>); 8] = [
            ("model.config", self.model_config.as_deref()),
            ("engine.kind", self.engine.map(|e| e.name().as_bytes())),
            (
                "engine.release",
                self.engine_release.as_ref().map(|l| l.as_str().as_bytes()),
            ),
            ("compute.dtype", self.dtype.as_ref().map(label_bytes)),
            (
                "compute.quantization",
                self.quantization.as_ref().map(label_bytes),
            ),
            (
                "cache.kv_dtype",
                self.kv_cache_dtype.as_ref().map(label_bytes),
            ),
            (
                "compute.attention_backend",
                self.attention_backend.as_ref().map(label_bytes),
            ),
            (
                "cache.variant",
                self.cache_variant.as_ref().map(label_bytes),
            ),
        ];
        missing.extend(
            required
                .iter()
                .filter(|(_, v)| v.is_none())
                .map(|(n, _)| *n),
        );
        if !missing.is_empty() {
            return Err(Error::MissingFields { fields: missing });
        }
        let mut fields = Vec::with_capacity(1 + required.len() + self.extras.len());
        if let Some(model) = self.model {
            fields.push(IdentityField {
                name: model.field_name().to_owned(),
                value: model.bytes().to_vec(),
            });
        }
        for (name, value) in required {
            fields.push(IdentityField {
                name: name.to_owned(),
                value: value.unwrap_or_default().to_vec(),
            });
        }
        for (name, value) in &self.extras {
            fields.push(IdentityField {
                name: format!("setting.{name}"),
                value: value.clone(),
            });
        }
        Ok(fields)
    }

    /// Computes the identity; fails closed when anything required is missing or LoRA is active.
    pub fn build(&self) -> Result<ComputationIdentity> {
        Ok(identity_of_fields(&self.fields()?))
    }
}

fn label_bytes(l: &Label) -> &[u8] {
    l.as_str().as_bytes()
}

/// Hashes an already-ordered field list (docs/format.md, "Computation identity").
fn identity_of_fields(fields: &[IdentityField]) -> ComputationIdentity {
    let size: usize = fields
        .iter()
        .map(|f| 12 + f.name.len() + f.value.len())
        .sum();
    let mut w = Writer::with_capacity(64 + size);
    w.u32(len_u32(IDENTITY_DOMAIN.len()))
        .raw(IDENTITY_DOMAIN.as_bytes())
        .u32(IDENTITY_VERSION)
        .u32(len_u32(fields.len()));
    for f in fields {
        w.field(&f.name, &f.value);
    }
    ComputationIdentity {
        digest: sha256(&w.into_bytes()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn complete() -> IdentityBuilder {
        let l = |v: &str| Label::new("t", v).unwrap();
        IdentityBuilder::new()
            .model(ModelDigest::Artifacts([7; 32]))
            .model_config_json(br#"{"hidden_size": 4096, "model_type": "llama"}"#)
            .unwrap()
            .engine(EngineKind::Vllm, l("0.33.0"))
            .dtype(l("bfloat16"))
            .quantization(l("none"))
            .kv_cache_dtype(l("bfloat16"))
            .attention_backend(l("FLASH_ATTN"))
            .cache_variant(l("paged"))
    }

    #[test]
    fn fails_closed_naming_every_missing_field() {
        let err = IdentityBuilder::new().build().unwrap_err();
        let Error::MissingFields { fields } = err else {
            panic!("wrong error {err:?}")
        };
        assert_eq!(fields.len(), 9);
        let partial = IdentityBuilder::new().model(ModelDigest::Operator([1; 32]));
        let Err(Error::MissingFields { fields }) = partial.build() else {
            panic!()
        };
        assert!(!fields.iter().any(|f| f.contains("digest")));
        assert!(fields.contains(&"model.config"));
    }

    #[test]
    fn displays_and_parses() {
        let id = complete().build().unwrap();
        let text = id.to_string();
        assert!(text.starts_with("v1:") && text.len() == 67);
        assert_eq!(text.parse::<ComputationIdentity>().unwrap(), id);
        assert!("v2:00".parse::<ComputationIdentity>().is_err());
        assert!(text.to_uppercase().parse::<ComputationIdentity>().is_err());
    }

    #[test]
    fn config_is_canonicalized_and_lora_refused() {
        let a = complete().build().unwrap();
        let b = complete()
            .model_config_json(b"{\"model_type\":\"llama\",\n \"hidden_size\": 4096.0}")
            .unwrap()
            .build()
            .unwrap();
        assert_eq!(a, b);
        assert_eq!(
            complete().lora_active(true).build(),
            Err(Error::UnsupportedLora)
        );
        assert!(complete().model_config_json(b"{\"a\":1,\"a\":1}").is_err());
    }

    #[test]
    fn operator_and_artifact_digests_differ() {
        let a = complete()
            .model(ModelDigest::Artifacts([1; 32]))
            .build()
            .unwrap();
        let b = complete()
            .model(ModelDigest::Operator([1; 32]))
            .build()
            .unwrap();
        assert_ne!(a, b);
        assert!(ModelDigest::operator_from_hex(&"A".repeat(64)).is_err());
        assert!(ModelDigest::operator_from_hex(&"a".repeat(63)).is_err());
        assert!(ModelDigest::operator_from_hex(&"a".repeat(64)).is_ok());
    }
}
