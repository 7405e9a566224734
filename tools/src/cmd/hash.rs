//! `orbitkv hash vllm|sglang|sglang-namespace`: the engines' native prefix hashes, bit-exact.

use clap::{Args, Subcommand, ValueEnum};
use orbitkv_state::engine_hash::{sglang, vllm};
use orbitkv_state::hex;
use serde_json::json;

use crate::output::Output;
use crate::{Failure, tokens};

/// Which engine's hash.
#[derive(Subcommand)]
pub enum HashCommand {
    /// vLLM block hashes (sha256_cbor, xxhash_cbor): one per full block.
    Vllm(VllmArgs),
    /// SGLang HiCache page hashes: one per page, trailing partial page included.
    Sglang(SglangArgs),
    /// SGLang's storage namespace seed for an extra key and/or cache salt.
    SglangNamespace(NamespaceArgs),
}

/// vLLM's CBOR-based algorithms.
#[derive(Clone, Copy, ValueEnum)]
pub enum Algo {
    /// SHA-256 over canonical CBOR.
    #[value(name = "sha256_cbor")]
    Sha256Cbor,
    /// xxh3-128 over canonical CBOR (needs a seed).
    #[value(name = "xxhash_cbor")]
    XxhashCbor,
}

/// The token source shared by the hash commands.
#[derive(Args)]
pub struct TokenArgs {
    /// Token ids, comma-separated.
    #[arg(long, value_name = "1,2,3,...", allow_hyphen_values = true)]
    tokens: Option<String>,
    /// Read token ids from a file (`-` = standard input), separated by commas or whitespace.
    #[arg(long, value_name = "PATH|-", conflicts_with = "tokens")]
    tokens_file: Option<String>,
}

/// `hash vllm`.
#[derive(Args)]
pub struct VllmArgs {
    /// Hash algorithm.
    #[arg(long, value_enum)]
    algo: Algo,
    /// Tokens per block.
    #[arg(long, value_name = "N")]
    block_size: usize,
    /// NONE_HASH seed; overrides PYTHONHASHSEED. Without either, sha256_cbor uses vLLM's default
    /// seed and xxhash_cbor is refused (vLLM would seed it randomly).
    #[arg(long, value_name = "STR")]
    seed: Option<String>,
    /// Continue a chain after this block hash.
    #[arg(long, value_name = "HEX")]
    parent: Option<String>,
    /// The request's cache_salt (enters the block at token 0 only, so not with --parent).
    #[arg(long, value_name = "STR", conflicts_with = "parent")]
    cache_salt: Option<String>,
    /// LoRA adapter name (with --lora-path).
    #[arg(long, value_name = "NAME", requires = "lora_path")]
    lora_name: Option<String>,
    /// LoRA adapter path (with --lora-name).
    #[arg(long, value_name = "PATH", requires = "lora_name")]
    lora_path: Option<String>,
    #[command(flatten)]
    tokens: TokenArgs,
}

/// `hash sglang`.
#[derive(Args)]
pub struct SglangArgs {
    /// Tokens per page; without it, one hash for the whole sequence.
    #[arg(long, value_name = "N")]
    page_size: Option<usize>,
    /// The prior hash the first page chains from (64 hex digits).
    #[arg(long, value_name = "HEX")]
    prior: Option<String>,
    /// SGLang's extra_key; with --cache-salt it seeds the chain when no --prior is given.
    #[arg(long, value_name = "STR")]
    extra_key: Option<String>,
    /// The request's cache_salt.
    #[arg(long, value_name = "STR")]
    cache_salt: Option<String>,
    #[command(flatten)]
    tokens: TokenArgs,
}

/// `hash sglang-namespace`.
#[derive(Args)]
pub struct NamespaceArgs {
    /// SGLang's extra_key.
    #[arg(long, value_name = "STR")]
    extra_key: Option<String>,
    /// The request's cache_salt.
    #[arg(long, value_name = "STR")]
    cache_salt: Option<String>,
}

/// Runs a hash command.
pub fn run(cmd: &HashCommand, out: &Output) -> Result<(), Failure> {
    match cmd {
        HashCommand::Vllm(a) => run_vllm(a, out),
        HashCommand::Sglang(a) => run_sglang(a, out),
        HashCommand::SglangNamespace(a) => run_namespace(a, out),
    }
}

fn lines(hashes: &[String]) -> String {
    hashes.iter().map(|h| format!("{h}\n")).collect()
}

fn refused(e: impl std::fmt::Display) -> Failure {
    Failure::refused(e.to_string())
}

fn run_vllm(a: &VllmArgs, out: &Output) -> Result<(), Failure> {
    let algo = match a.algo {
        Algo::Sha256Cbor => vllm::VllmHashAlgo::Sha256Cbor,
        Algo::XxhashCbor => vllm::VllmHashAlgo::XxhashCbor,
    };
    let seed = match &a.seed {
        Some(s) => Some(s.clone()),
        None => match std::env::var_os("PYTHONHASHSEED") {
            None => None,
            Some(v) => Some(v.into_string().map_err(|_| {
                Failure::refused("PYTHONHASHSEED is not valid UTF-8: vLLM would refuse it too")
            })?),
        },
    };
    let hasher = vllm::VllmHasher::new(algo, a.block_size, seed.as_deref()).map_err(refused)?;
    let parent = match &a.parent {
        None => None,
        Some(p) => {
            let bytes = hex::decode(p, "--parent").map_err(refused)?;
            let want = algo.domain().native_len();
            if bytes.len() != want {
                return Err(Failure::refused(format!(
                    "--parent: a {} hash has {want} bytes ({} hex digits), got {}",
                    algo.name(),
                    want * 2,
                    bytes.len()
                )));
            }
            Some(bytes)
        }
    };
    let toks = tokens::read(a.tokens.tokens.as_deref(), a.tokens.tokens_file.as_deref())?;
    let extras = vllm::RequestExtras {
        lora: a.lora_name.clone().zip(a.lora_path.clone()),
        cache_salt: a.cache_salt.clone(),
        ..Default::default()
    };
    let hashes = hasher
        .block_hashes(&toks, 0, parent.as_deref(), &extras)
        .map_err(refused)?;
    let hex_hashes: Vec<String> = hashes.iter().map(|h| hex::encode(h)).collect();
    out.emit(&lines(&hex_hashes), || {
        json!({
            "engine": "vllm",
            "algo": algo.name(),
            "block_size": a.block_size,
            "none_hash": hex::encode(hasher.none_hash()),
            "tokens": toks.len(),
            "hashes": hex_hashes,
        })
    })
}

fn parse_prior(p: Option<&str>) -> Result<Option<[u8; 32]>, Failure> {
    match p {
        // SGLang treats an empty prior as none.
        None | Some("") => Ok(None),
        Some(p) => hex::decode_array::<32>(p, "--prior")
            .map(Some)
            .map_err(refused),
    }
}

fn run_sglang(a: &SglangArgs, out: &Output) -> Result<(), Failure> {
    let prior = parse_prior(a.prior.as_deref())?;
    let prior = sglang::storage_prior(prior, a.extra_key.as_deref(), a.cache_salt.as_deref());
    let toks = tokens::read(a.tokens.tokens.as_deref(), a.tokens.tokens_file.as_deref())?;
    match a.page_size {
        Some(page) => {
            let hashes = sglang::page_hashes(&toks, page, prior).map_err(refused)?;
            let hex_hashes: Vec<String> = hashes.iter().map(|h| hex::encode(h)).collect();
            out.emit(&lines(&hex_hashes), || {
                json!({
                    "engine": "sglang",
                    "page_size": page,
                    "tokens": toks.len(),
                    "hashes": hex_hashes,
                })
            })
        }
        None => {
            let h = hex::encode(&sglang::sequence_hash(&toks, prior).map_err(refused)?);
            out.emit(&format!("{h}\n"), || {
                json!({ "engine": "sglang", "page_size": null, "tokens": toks.len(), "hash": h })
            })
        }
    }
}

fn run_namespace(a: &NamespaceArgs, out: &Output) -> Result<(), Failure> {
    let Some(seed) = sglang::namespace_seed(a.extra_key.as_deref(), a.cache_salt.as_deref()) else {
        return Err(Failure::refused(
            "give --extra-key and/or --cache-salt: without either SGLang uses no namespace seed",
        ));
    };
    let h = hex::encode(&seed);
    out.emit(&format!("{h}\n"), || json!({ "seed": h }))
}
