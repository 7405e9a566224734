//! `orbitkv identity`: the computation identity of a model directory or hub snapshot.
//!
//! The engine-setting flags have documented defaults for this inspection command only (the output
//! says which were used); the library builder has none and fails closed.

use std::path::PathBuf;

use clap::Args;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use orbitkv_adapters::identity::fingerprint::Progress;
use orbitkv_adapters::identity::{
    EngineSettings, FingerprintOptions, IdentityEnv, ModelSource, hub, resolve,
};
use orbitkv_state::{EngineKind, Label, ModelDigest, hex};
use serde_json::json;

use crate::Failure;
use crate::output::Output;

/// Default engine for inspection.
pub const DEFAULT_ENGINE: &str = "vllm@0.33.0";
/// Default compute dtype for inspection.
pub const DEFAULT_DTYPE: &str = "bfloat16";
/// Default quantization for inspection.
pub const DEFAULT_QUANTIZATION: &str = "none";
/// Default cache variant for inspection.
pub const DEFAULT_CACHE_VARIANT: &str = "paged";

/// `identity` arguments.
#[derive(Args)]
pub struct IdentityArgs {
    /// A model directory, or an `org/name` hub id (with --revision).
    #[arg(value_name = "MODEL_DIR | org/name")]
    model: String,
    /// Full 40-hex commit of a hub model.
    #[arg(long, value_name = "COMMIT")]
    revision: Option<String>,
    /// Hub cache directory (default: HF_HUB_CACHE, HF_HOME/hub, ~/.cache/huggingface/hub).
    #[arg(long, value_name = "DIR")]
    hub_cache: Option<PathBuf>,
    /// Engine and release (default: vllm@0.33.0).
    #[arg(long, value_name = "NAME@VERSION")]
    engine: Option<String>,
    /// Compute dtype (default: bfloat16).
    #[arg(long, value_name = "D")]
    dtype: Option<String>,
    /// KV-cache dtype [default: the compute dtype].
    #[arg(long, value_name = "D")]
    kv_dtype: Option<String>,
    /// Weight quantization [default: none].
    #[arg(long, value_name = "Q")]
    quantization: Option<String>,
    /// Attention backend [default: FLASH_ATTN for vllm, flashinfer for sglang].
    #[arg(long, value_name = "B")]
    attention_backend: Option<String>,
    /// Cache representation variant [default: paged].
    #[arg(long, value_name = "V")]
    cache_variant: Option<String>,
    /// Hashing threads [default: all cores].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..))]
    threads: Option<u16>,
}

struct Bar(ProgressBar);

impl Progress for Bar {
    fn start(&self, total_bytes: u64, _files: usize) {
        self.0.set_length(total_bytes);
    }
    fn advance(&self, bytes: u64) {
        self.0.inc(bytes);
    }
}

pub(crate) fn label(what: &'static str, v: &str) -> Result<Label, Failure> {
    Label::new(what, v).map_err(|e| Failure::refused(e.to_string()))
}

/// Settings from flags, and the names of the flags that took their defaults.
fn settings(a: &IdentityArgs) -> Result<(EngineSettings, Vec<&'static str>), Failure> {
    let mut defaults = Vec::new();
    let mut pick = |flag: &'static str, v: &Option<String>, default: &str| -> String {
        v.clone().unwrap_or_else(|| {
            defaults.push(flag);
            default.to_owned()
        })
    };
    let engine = pick("--engine", &a.engine, DEFAULT_ENGINE);
    let Some((name, release)) = engine.split_once('@') else {
        return Err(Failure::refused(format!(
            "--engine {engine:?}: expected NAME@VERSION, e.g. {DEFAULT_ENGINE}"
        )));
    };
    let kind: EngineKind = name
        .parse()
        .map_err(|e: orbitkv_state::Error| Failure::refused(e.to_string()))?;
    let dtype = pick("--dtype", &a.dtype, DEFAULT_DTYPE);
    let kv = pick("--kv-dtype", &a.kv_dtype, &dtype);
    let quant = pick("--quantization", &a.quantization, DEFAULT_QUANTIZATION);
    let backend_default = match kind {
        EngineKind::Vllm => "FLASH_ATTN",
        EngineKind::Sglang => "flashinfer",
    };
    let backend = pick("--attention-backend", &a.attention_backend, backend_default);
    let variant = pick("--cache-variant", &a.cache_variant, DEFAULT_CACHE_VARIANT);
    Ok((
        EngineSettings {
            engine: kind,
            release: label("engine release", release)?,
            dtype: label("--dtype", &dtype)?,
            kv_cache_dtype: label("--kv-dtype", &kv)?,
            quantization: label("--quantization", &quant)?,
            attention_backend: label("--attention-backend", &backend)?,
            cache_variant: label("--cache-variant", &variant)?,
            settings: Vec::new(),
            lora_active: false,
        },
        defaults,
    ))
}

/// Runs `identity`.
pub fn run(a: &IdentityArgs, out: &Output) -> Result<(), Failure> {
    let refused = |e: orbitkv_adapters::Error| Failure::refused(e.to_string());
    let (settings, defaults) = settings(a)?;
    let env = IdentityEnv::from_process().map_err(refused)?;
    let source = ModelSource::from_arg(&a.model, a.revision.as_deref(), || {
        hub::hub_cache_dir(a.hub_cache.as_deref(), &|k| std::env::var(k).ok())
    })
    .map_err(refused)?;

    let bar = ProgressBar::with_draw_target(Some(0), ProgressDrawTarget::stderr());
    bar.set_style(
        ProgressStyle::with_template(
            "hashing {bytes}/{total_bytes} {wide_bar} {bytes_per_sec} eta {eta}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let progress = Bar(bar);
    let mut opts = FingerprintOptions {
        progress: Some(&progress),
        ..FingerprintOptions::default()
    };
    if let Some(t) = a.threads {
        opts.threads = usize::from(t);
    }
    let resolved = resolve(&source, &settings, &env, &opts).map_err(refused)?;
    progress.0.finish_and_clear();

    let (kind, digest) = match resolved.model {
        ModelDigest::Artifacts(d) => ("artifacts", d),
        ModelDigest::Operator(d) => ("operator", d),
    };
    let mut text = format!("{}\n", resolved.identity);
    text.push_str(&format!("model: {}\n", resolved.model_dir.display()));
    match resolved.model {
        ModelDigest::Artifacts(_) => text.push_str(&format!(
            "artifacts: {} ({} files, {} bytes, by content)\n",
            hex::encode(&digest),
            resolved.files.len(),
            resolved.hashed_bytes
        )),
        ModelDigest::Operator(_) => text.push_str(&format!(
            "artifacts: {} (operator digest from ORBITKV_MODEL_FINGERPRINT; files not read)\n",
            hex::encode(&digest)
        )),
    }
    for f in &resolved.fields {
        if f.name.starts_with("model.") {
            continue;
        }
        text.push_str(&format!("{}: {}\n", f.name, f.display_value()));
    }
    if let Some(scope) = &env.scope {
        text.push_str(&format!(
            "cache scope: {} (enters the namespace, not the identity)\n",
            scope.as_str()
        ));
    }
    if !defaults.is_empty() {
        text.push_str(&format!(
            "defaults used (inspection only; engines supply their resolved settings): {}\n",
            defaults.join(", ")
        ));
    }
    out.emit(&text, || {
        json!({
            "identity": resolved.identity.to_string(),
            "model_dir": resolved.model_dir.display().to_string(),
            "model_digest": { "kind": kind, "digest": hex::encode(&digest) },
            "hashed_bytes": resolved.hashed_bytes,
            "files": resolved.files.iter().map(|f| json!({
                "path": f.path,
                "size": f.size,
                "digest": hex::encode(&f.digest),
            })).collect::<Vec<_>>(),
            "fields": resolved.fields.iter().map(|f| json!({
                "name": f.name,
                "value": f.display_value(),
            })).collect::<Vec<_>>(),
            "cache_scope": env.scope.as_ref().map(|s| s.as_str().to_owned()),
            "defaults_used": defaults,
        })
    })
}
