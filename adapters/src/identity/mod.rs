//! Identity resolution: from a model directory (or a hub snapshot) and the engine's settings to a
//! [`ComputationIdentity`], failing closed whenever something required cannot be established.
//! Runs once at startup, never per block.

pub mod env;
pub mod fingerprint;
pub mod hub;

use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};

use orbitkv_state::{
    ComputationIdentity, EngineKind, IdentityBuilder, IdentityField, Label, ModelDigest,
};

use crate::error::{Error, Result};
pub use env::IdentityEnv;
pub use fingerprint::{DirFingerprint, FileDigest, FingerprintOptions};

/// Largest `config.json` accepted.
pub const MAX_CONFIG_BYTES: u64 = 16 << 20;
/// Files that mark a LoRA/PEFT adapter directory.
const ADAPTER_MARKERS: &[&str] = &["adapter_config.json", "adapter_model.safetensors"];

/// Where the model comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelSource {
    /// A local directory.
    Dir(PathBuf),
    /// A hub snapshot in a local cache.
    Hub {
        /// `org/name`.
        repo: String,
        /// Full 40-hex commit.
        revision: String,
        /// The cache directory.
        cache: PathBuf,
    },
}

impl ModelSource {
    /// Interprets a command-line model argument: an existing directory wins; otherwise an
    /// `org/name` id needs a revision and a hub cache. `cache` is computed only when needed.
    pub fn from_arg(
        arg: &str,
        revision: Option<&str>,
        cache: impl FnOnce() -> Result<PathBuf>,
    ) -> Result<Self> {
        let path = Path::new(arg);
        if path.is_dir() {
            if revision.is_some() {
                return Err(Error::HubRepo {
                    repo: arg.to_owned(),
                    reason: "--revision applies to hub ids, but this is a local directory",
                });
            }
            return Ok(ModelSource::Dir(path.to_owned()));
        }
        if path.exists() {
            return Err(Error::NotADirectory {
                path: path.to_owned(),
            });
        }
        if !hub::looks_like_repo_id(arg) {
            return Err(Error::UnknownModel(arg.to_owned()));
        }
        let Some(revision) = revision else {
            return Err(Error::HubRevisionMissing {
                repo: arg.to_owned(),
            });
        };
        hub::validate_revision(revision)?;
        Ok(ModelSource::Hub {
            repo: arg.to_owned(),
            revision: revision.to_owned(),
            cache: cache()?,
        })
    }

    /// The directory holding the artifacts.
    pub fn directory(&self) -> Result<PathBuf> {
        match self {
            ModelSource::Dir(p) => Ok(p.clone()),
            ModelSource::Hub {
                repo,
                revision,
                cache,
            } => hub::snapshot_dir(cache, repo, revision),
        }
    }
}

/// The engine's settings that enter the identity. Adapters fill these from the engine's resolved
/// configuration; nothing here has a default.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineSettings {
    /// Engine kind.
    pub engine: EngineKind,
    /// Engine release.
    pub release: Label,
    /// Compute dtype.
    pub dtype: Label,
    /// KV-cache dtype as resolved.
    pub kv_cache_dtype: Label,
    /// Weight quantization (`none` when unquantized).
    pub quantization: Label,
    /// Attention backend.
    pub attention_backend: Label,
    /// Cache representation variant.
    pub cache_variant: Label,
    /// Further settings that change KV bytes, by name.
    pub settings: Vec<(String, Vec<u8>)>,
    /// Whether a LoRA adapter is active (refused).
    pub lora_active: bool,
}

/// A resolved identity and everything that went into it.
#[derive(Debug, Clone)]
pub struct ResolvedIdentity {
    /// The identity.
    pub identity: ComputationIdentity,
    /// The artifacts' digest (content or operator).
    pub model: ModelDigest,
    /// The directory read.
    pub model_dir: PathBuf,
    /// Per-file digests (empty when the operator digest was used).
    pub files: Vec<FileDigest>,
    /// Bytes hashed.
    pub hashed_bytes: u64,
    /// Every field, in hashing order.
    pub fields: Vec<IdentityField>,
}

/// Reads `config.json`, bounded, refusing a missing or oversized one.
fn read_config(dir: &Path) -> Result<Vec<u8>> {
    let path = dir.join("config.json");
    let file = match fs::File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(Error::MissingConfig {
                path: dir.to_owned(),
            });
        }
        Err(source) => return Err(Error::Io { path, source }),
    };
    let mut buf = Vec::new();
    file.take(MAX_CONFIG_BYTES + 1)
        .read_to_end(&mut buf)
        .map_err(|source| Error::Io {
            path: path.clone(),
            source,
        })?;
    if buf.len() as u64 > MAX_CONFIG_BYTES {
        return Err(Error::ConfigTooLarge {
            path,
            limit: MAX_CONFIG_BYTES,
        });
    }
    Ok(buf)
}

/// Resolves the computation identity of `source` under `settings` and `env`.
pub fn resolve(
    source: &ModelSource,
    settings: &EngineSettings,
    env: &IdentityEnv,
    opts: &FingerprintOptions<'_>,
) -> Result<ResolvedIdentity> {
    if settings.lora_active {
        return Err(Error::Lora {
            what: "an active LoRA adapter".to_owned(),
        });
    }
    let dir = source.directory()?;
    for marker in ADAPTER_MARKERS {
        if dir.join(marker).exists() {
            return Err(Error::Lora {
                what: format!("{} contains {marker}", dir.display()),
            });
        }
    }
    let config = read_config(&dir)?;
    let (model, files, hashed_bytes) = match env.operator_digest {
        Some(d) => {
            tracing::info!(
                "{} set: artifact files are not read; the operator digest stands for them",
                env::MODEL_FINGERPRINT_VAR
            );
            (d, Vec::new(), 0)
        }
        None => {
            let fp = fingerprint::fingerprint_dir(&dir, opts)?;
            (ModelDigest::Artifacts(fp.digest), fp.files, fp.total_bytes)
        }
    };
    let mut b = IdentityBuilder::new()
        .model(model)
        .model_config_json(&config)?
        .engine(settings.engine, settings.release.clone())
        .dtype(settings.dtype.clone())
        .kv_cache_dtype(settings.kv_cache_dtype.clone())
        .quantization(settings.quantization.clone())
        .attention_backend(settings.attention_backend.clone())
        .cache_variant(settings.cache_variant.clone());
    for (name, value) in &settings.settings {
        b = b.setting(name, value)?;
    }
    let fields = b.fields()?;
    let identity = b.build()?;
    Ok(ResolvedIdentity {
        identity,
        model,
        model_dir: dir,
        files,
        hashed_bytes,
        fields,
    })
}
