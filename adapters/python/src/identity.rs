//! Identity resolution and the engines' native prefix hashes, by the adapters crate and the
//! state crate: the same code as `orbitkv identity` and `orbitkv hash`.

use std::path::PathBuf;

use pyo3::prelude::*;
use pyo3::types::PyBytes;

use orbitkv_adapters::identity::{
    EngineSettings, FingerprintOptions, IdentityEnv, ModelSource, hub, resolve,
};
use orbitkv_state::engine_hash::{sglang, vllm};
use orbitkv_state::{ModelDigest, hex};

use crate::errors::{InvalidInput, error, invalid};
use crate::layout::{engine_kind, label};

/// A resolved computation identity: what the engine registers, and what went into it.
#[pyclass(frozen, module = "orbitkv._native", get_all)]
pub struct Identity {
    /// The identity as text, `v1:<64 hex>`.
    pub text: String,
    /// The model directory read.
    pub model_dir: String,
    /// `artifacts` (hashed by content) or `operator` (from `ORBITKV_MODEL_FINGERPRINT`).
    pub model_digest_kind: String,
    /// The model digest, hex.
    pub model_digest: String,
    /// Bytes of model files hashed (0 with an operator digest).
    pub hashed_bytes: u64,
    /// Every field of the identity, `(name, value)`, in hashing order.
    pub fields: Vec<(String, String)>,
    /// `ORBITKV_CACHE_SCOPE`, when set: it enters the namespace, not the identity.
    pub scope: Option<String>,
    digest: [u8; 32],
}

#[pymethods]
impl Identity {
    /// The 32-byte identity digest, as Register carries it.
    #[getter]
    fn digest<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.digest)
    }

    fn __repr__(&self) -> String {
        format!("Identity({:?}, model_dir={:?})", self.text, self.model_dir)
    }
}

fn identity_error(py: Python<'_>, e: &orbitkv_adapters::Error) -> PyErr {
    error::<InvalidInput>(py, "identity", false, 0.0, e.to_string())
}

/// Resolves the computation identity of `model` (a model directory, or an `org/name` hub id
/// with `revision`) for the engine settings given, reading `ORBITKV_MODEL_FINGERPRINT` and
/// `ORBITKV_CACHE_SCOPE` from the environment. Every setting is required: none has a default.
/// `settings` are further engine settings that change KV bytes, by name. A LoRA adapter
/// (`lora=True`, or adapter files in the directory) is refused.
#[pyfunction]
#[pyo3(signature = (
    model, *, engine, release, dtype, kv_cache_dtype, quantization, attention_backend,
    cache_variant, settings = Vec::new(), revision = None, hub_cache = None, lora = false,
    threads = None
))]
#[expect(
    clippy::too_many_arguments,
    reason = "keyword arguments of a Python function"
)]
pub fn resolve_identity(
    py: Python<'_>,
    model: &str,
    engine: &str,
    release: &str,
    dtype: &str,
    kv_cache_dtype: &str,
    quantization: &str,
    attention_backend: &str,
    cache_variant: &str,
    settings: Vec<(String, Vec<u8>)>,
    revision: Option<&str>,
    hub_cache: Option<PathBuf>,
    lora: bool,
    threads: Option<usize>,
) -> PyResult<Identity> {
    let kind = engine_kind(py, engine)?;
    let engine_settings = EngineSettings {
        engine: kind,
        release: label(py, "release", release)?,
        dtype: label(py, "dtype", dtype)?,
        kv_cache_dtype: label(py, "kv_cache_dtype", kv_cache_dtype)?,
        quantization: label(py, "quantization", quantization)?,
        attention_backend: label(py, "attention_backend", attention_backend)?,
        cache_variant: label(py, "cache_variant", cache_variant)?,
        settings,
        lora_active: lora,
    };
    let env = IdentityEnv::from_process().map_err(|e| identity_error(py, &e))?;
    let source = ModelSource::from_arg(model, revision, || {
        hub::hub_cache_dir(hub_cache.as_deref(), &|k| std::env::var(k).ok())
    })
    .map_err(|e| identity_error(py, &e))?;
    let mut opts = FingerprintOptions::default();
    if let Some(t) = threads {
        opts.threads = t.max(1);
    }
    // Hashing a model's files takes seconds: other Python threads run meanwhile.
    let resolved = py
        .detach(|| resolve(&source, &engine_settings, &env, &opts))
        .map_err(|e| identity_error(py, &e))?;
    let (kind, digest) = match resolved.model {
        ModelDigest::Artifacts(d) => ("artifacts", d),
        ModelDigest::Operator(d) => ("operator", d),
    };
    Ok(Identity {
        text: resolved.identity.to_string(),
        model_dir: resolved.model_dir.display().to_string(),
        model_digest_kind: kind.to_owned(),
        model_digest: hex::encode(&digest),
        hashed_bytes: resolved.hashed_bytes,
        fields: resolved
            .fields
            .iter()
            .map(|f| (f.name.to_owned(), f.display_value()))
            .collect(),
        scope: env.scope.as_ref().map(|s| s.as_str().to_owned()),
        digest: *resolved.identity.digest(),
    })
}

/// vLLM's block hashes of `tokens` (one per full block), bit-exact: `algo` is `sha256_cbor`
/// or `xxhash_cbor`; `seed` is the NONE_HASH seed (`PYTHONHASHSEED`; required by
/// `xxhash_cbor`); `parent` continues a chain from `start_token`; `cache_salt` and multimodal
/// items `(identifier, offset, length)` enter the blocks they touch, as in vLLM.
#[pyfunction]
#[pyo3(signature = (tokens, block_size, *, algo = "sha256_cbor", seed = None, parent = None,
    start_token = 0, cache_salt = None, mm = Vec::new()))]
#[expect(
    clippy::too_many_arguments,
    reason = "keyword arguments of a Python function"
)]
pub fn vllm_block_hashes<'py>(
    py: Python<'py>,
    tokens: Vec<u64>,
    block_size: usize,
    algo: &str,
    seed: Option<&str>,
    parent: Option<Vec<u8>>,
    start_token: u64,
    cache_salt: Option<String>,
    mm: Vec<(String, u64, u64)>,
) -> PyResult<Vec<Bound<'py, PyBytes>>> {
    let algo = vllm::VllmHashAlgo::from_name(algo).map_err(|e| invalid(py, e.to_string()))?;
    let hasher =
        vllm::VllmHasher::new(algo, block_size, seed).map_err(|e| invalid(py, e.to_string()))?;
    let extras = vllm::RequestExtras {
        lora: None,
        cache_salt,
        mm: mm
            .into_iter()
            .map(|(identifier, offset, length)| vllm::MmItem {
                identifier,
                offset,
                length,
            })
            .collect(),
        prompt_embeds: None,
    };
    let hashes = hasher
        .block_hashes(&tokens, start_token, parent.as_deref(), &extras)
        .map_err(|e| invalid(py, e.to_string()))?;
    Ok(hashes.iter().map(|h| PyBytes::new(py, h)).collect())
}

/// SGLang's HiCache page hashes of `tokens` (one per page, a trailing partial page
/// included), bit-exact; `prior` continues a chain (or is the storage namespace seed).
#[pyfunction]
#[pyo3(signature = (tokens, page_size, *, prior = None))]
pub fn sglang_page_hashes<'py>(
    py: Python<'py>,
    tokens: Vec<u64>,
    page_size: usize,
    prior: Option<Vec<u8>>,
) -> PyResult<Vec<Bound<'py, PyBytes>>> {
    let prior = match prior {
        None => None,
        Some(p) => Some(
            <[u8; 32]>::try_from(p.as_slice())
                .map_err(|_| invalid(py, format!("prior: 32 bytes expected, got {}", p.len())))?,
        ),
    };
    let hashes =
        sglang::page_hashes(&tokens, page_size, prior).map_err(|e| invalid(py, e.to_string()))?;
    Ok(hashes.iter().map(|h| PyBytes::new(py, h)).collect())
}

/// SGLang's storage namespace seed for an `extra_key` and/or `cache_salt` (None for neither).
#[pyfunction]
#[pyo3(signature = (extra_key = None, cache_salt = None))]
pub fn sglang_namespace_seed<'py>(
    py: Python<'py>,
    extra_key: Option<&str>,
    cache_salt: Option<&str>,
) -> Option<Bound<'py, PyBytes>> {
    sglang::namespace_seed(extra_key, cache_salt).map(|s| PyBytes::new(py, &s))
}
