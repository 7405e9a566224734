//! `orbitkv engine-sim`: a simulated engine instance (one process, one thread per rank) against a
//! running daemon. It owns host page pools, computes block keys with vLLM's own hash code,
//! publishes what it computes and loads what the daemon proves, checking every loaded byte
//! against the bytes its computation produces and every proof against its recovery contract.
//! It reports hits, proven tokens, misses by reason and `wrong_bytes` (always 0; exit 3
//! otherwise).

use std::path::PathBuf;

use clap::Args;
use orbitkv_adapters::identity::{EngineSettings, FingerprintOptions, IdentityEnv, ModelSource};
use orbitkv_protocol::Role;
use orbitkv_sim::workload::{Synthetic, trace_tokens};
use orbitkv_sim::{EngineOptions, Report, SimContract, SimEngine, SimInstance, SimPlacement};
use orbitkv_state::{EngineKind, IdentityBuilder, ModelDigest, hex};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::identity::{DEFAULT_CACHE_VARIANT, DEFAULT_ENGINE, DEFAULT_QUANTIZATION, label};
use crate::Failure;
use crate::output::Output;
use crate::trace::TraceRequest;

/// Exit code when a loaded byte was wrong or a proof did not match the contract.
pub const EXIT_WRONG: u8 = 3;

/// What the simulated instance is: the flags shared by `engine-sim` and `loadgen`.
#[derive(Args, Clone)]
pub struct InstanceArgs {
    /// The daemon's control socket.
    #[arg(
        long,
        value_name = "PATH",
        default_value = "./orbitkv-data/orbitkv.sock"
    )]
    pub socket: PathBuf,
    /// Worker ranks (tensor × pipeline parallel); one thread each, plus the scheduler.
    #[arg(long, value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..=64))]
    pub ranks: u32,
    /// The model directory whose content names the computation [default: a built-in model].
    #[arg(long, value_name = "DIR")]
    pub model_dir: Option<PathBuf>,
    /// Engine and release.
    #[arg(long, value_name = "NAME@VERSION", default_value = DEFAULT_ENGINE)]
    pub engine: String,
    /// Tokens per block.
    #[arg(long, value_name = "N", default_value_t = 16,
          value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub block_size: u32,
    /// Compute dtype.
    #[arg(long, value_name = "D", default_value = "bfloat16")]
    pub dtype: String,
    /// KV-cache dtype [default: the compute dtype].
    #[arg(long, value_name = "D")]
    pub kv_dtype: Option<String>,
    /// Cache scope (tenant isolation) [default: none].
    #[arg(long, value_name = "S")]
    pub scope: Option<String>,
    /// `dense` (one full-attention group) or `hybrid` (sliding window + recurrent state).
    #[arg(long, value_name = "C", default_value = "dense")]
    pub contract: String,
    /// Where pages lie in the pool: `page` (each page one run), `layer` (layer-outermost, as
    /// vLLM's LBNHC) or `kv-buffers` (K apart from V, as SGLang's layer_first) — records are
    /// the same bytes whichever it is; or `page-first` (SGLang's page_first: layers inside
    /// tokens, another byte order, so records of its own).
    #[arg(long, value_name = "P", default_value = "page")]
    pub placement: String,
    /// Pipeline stages' layer counts, comma-separated (`3,2`: two stages of 3 and 2 layers);
    /// `--ranks` must be a multiple of the stage count [default: one stage of --layers].
    #[arg(long, value_name = "N,N", value_delimiter = ',')]
    pub pipeline_layers: Vec<u32>,
    /// Play an engine without a scheduler process (as SGLang): the workers seal alone and the
    /// engine's queries go under worker 0's session.
    #[arg(long)]
    pub no_scheduler: bool,
    /// Back every cache group with the same pool bytes (vLLM's hybrid allocator); the groups'
    /// pages must be of one size.
    #[arg(long)]
    pub aliased: bool,
    /// Model layers.
    #[arg(long, value_name = "N", default_value_t = 2,
          value_parser = clap::value_parser!(u32).range(1..=256))]
    pub layers: u32,
    /// KV heads per rank.
    #[arg(long, value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..=256))]
    pub kv_heads: u32,
    /// Elements per head (the page layout).
    #[arg(long, value_name = "N", default_value_t = 4,
          value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub head_size: u32,
    /// Pages in each worker's pool.
    #[arg(long, value_name = "N", default_value_t = 1024,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub pool_pages: u32,
    /// Publish nothing (an engine that only consumes the cache).
    #[arg(long)]
    pub consumer: bool,
    /// Fault injection: this worker rank never publishes (repeatable).
    #[arg(long, value_name = "R")]
    pub silent_rank: Vec<u32>,
    /// Seed of the synthetic requests.
    #[arg(long, value_name = "S", default_value_t = 0)]
    pub seed: u64,
    /// A Mooncake-format trace to replay instead of synthetic requests.
    #[arg(long, value_name = "FILE")]
    pub trace: Option<PathBuf>,
}

impl InstanceArgs {
    /// The computation identity: the model directory's content (or the built-in model's
    /// digest) under the engine settings the flags give.
    fn identity(&self) -> Result<[u8; 32], Failure> {
        let refused = |e: String| Failure::refused(e);
        let Some((name, release)) = self.engine.split_once('@') else {
            return Err(refused(format!(
                "--engine {:?}: expected NAME@VERSION, e.g. {DEFAULT_ENGINE}",
                self.engine
            )));
        };
        let kind: EngineKind = name
            .parse()
            .map_err(|e: orbitkv_state::Error| refused(e.to_string()))?;
        let kv = self.kv_dtype.clone().unwrap_or_else(|| self.dtype.clone());
        let settings = EngineSettings {
            engine: kind,
            release: label("engine release", release)?,
            dtype: label("--dtype", &self.dtype)?,
            kv_cache_dtype: label("--kv-dtype", &kv)?,
            quantization: label("quantization", DEFAULT_QUANTIZATION)?,
            attention_backend: label("attention backend", "FLASH_ATTN")?,
            cache_variant: label("cache variant", DEFAULT_CACHE_VARIANT)?,
            settings: Vec::new(),
            lora_active: false,
        };
        let identity = match &self.model_dir {
            Some(dir) => {
                let env = IdentityEnv::parse(None, None).map_err(|e| refused(e.to_string()))?;
                orbitkv_adapters::identity::resolve(
                    &ModelSource::Dir(dir.clone()),
                    &settings,
                    &env,
                    &FingerprintOptions::default(),
                )
                .map_err(|e| refused(e.to_string()))?
                .identity
            }
            None => IdentityBuilder::new()
                .model(ModelDigest::Operator(
                    Sha256::digest(b"orbitkv engine-sim built-in model").into(),
                ))
                .model_config_json(br#"{"model_type":"orbitkv-sim","num_hidden_layers":2}"#)
                .map_err(|e| refused(e.to_string()))?
                .engine(settings.engine, settings.release)
                .dtype(settings.dtype)
                .kv_cache_dtype(settings.kv_cache_dtype)
                .quantization(settings.quantization)
                .attention_backend(settings.attention_backend)
                .cache_variant(settings.cache_variant)
                .build()
                .map_err(|e| refused(e.to_string()))?,
        };
        Ok(*identity.digest())
    }

    /// The simulated instance named `name`.
    pub fn instance(&self, name: &str) -> Result<SimInstance, Failure> {
        let contract = SimContract::from_name(&self.contract).ok_or_else(|| {
            Failure::refused(format!(
                "--contract {:?}: expected dense or hybrid",
                self.contract
            ))
        })?;
        let release = self
            .engine
            .split_once('@')
            .map_or(self.engine.as_str(), |(_, r)| r);
        let mut inst = SimInstance::new(name, self.ranks);
        inst.identity = self.identity()?;
        inst.block_tokens = self.block_size;
        inst.dtype.clone_from(&self.dtype);
        inst.kv_dtype = self.kv_dtype.clone().unwrap_or_else(|| self.dtype.clone());
        inst.release = release.to_owned();
        inst.scope = self.scope.clone().unwrap_or_default();
        inst.contract = contract;
        inst.placement = SimPlacement::from_name(&self.placement).ok_or_else(|| {
            Failure::refused(format!(
                "--placement {:?}: expected page, layer, kv-buffers or page-first",
                self.placement
            ))
        })?;
        inst.aliased = self.aliased;
        inst.no_scheduler = self.no_scheduler;
        if !self.pipeline_layers.is_empty() {
            let stages = u32::try_from(self.pipeline_layers.len()).unwrap_or(u32::MAX);
            if !self.ranks.is_multiple_of(stages) || self.pipeline_layers.contains(&0) {
                return Err(Failure::refused(format!(
                    "--pipeline-layers: {stages} stages of at least one layer each, and --ranks {} a multiple of them",
                    self.ranks
                )));
            }
            inst.pipeline_layers.clone_from(&self.pipeline_layers);
        }
        inst.layers = self.layers;
        inst.kv_heads = self.kv_heads;
        inst.head_size = self.head_size;
        // Refuse an inconsistent description before connecting.
        inst.layout().map_err(|e| Failure::refused(e.to_string()))?;
        let spec = inst.pool_spec(1, self.pool_pages);
        spec.validate()
            .map_err(|e| Failure::refused(format!("the page pool: {e}")))?;
        Ok(inst)
    }

    /// Engine options for `inst`.
    pub fn options(&self, inst: SimInstance) -> EngineOptions {
        let mut o = EngineOptions::new(self.socket.clone(), inst);
        o.pool_pages = self.pool_pages;
        o.publish = !self.consumer;
        o.silent_ranks.clone_from(&self.silent_rank);
        o
    }

    /// The requests: the first `limit` of the trace, or `limit` synthetic ones (`default`
    /// without a limit).
    pub fn requests(&self, limit: Option<usize>, default: usize) -> Result<Requests, Failure> {
        match &self.trace {
            Some(path) => Ok(Requests::Trace(crate::trace::load(path, limit)?)),
            None => Ok(Requests::Synthetic(Synthetic::new(
                self.seed,
                limit.unwrap_or(default) as u64,
                self.block_size,
            ))),
        }
    }
}

/// Where requests come from; each request's tokens are made when it is sent.
pub enum Requests {
    /// A trace's requests.
    Trace(Vec<TraceRequest>),
    /// Synthetic requests.
    Synthetic(Synthetic),
}

impl Requests {
    /// How many there are.
    pub fn len(&self) -> usize {
        match self {
            Requests::Trace(t) => t.len(),
            Requests::Synthetic(s) => s.len() as usize,
        }
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The tokens of request `i`.
    pub fn tokens(&self, i: usize) -> Vec<u64> {
        match self {
            Requests::Trace(t) => t
                .get(i)
                .map(|r| trace_tokens(&r.hash_ids, r.input_length))
                .unwrap_or_default(),
            Requests::Synthetic(s) => s.request(i as u64),
        }
    }
}

/// `engine-sim` arguments.
#[derive(Args)]
pub struct EngineSimArgs {
    #[command(flatten)]
    instance: InstanceArgs,
    /// The instance's name [default: engine-sim-PID].
    #[arg(long = "instance", value_name = "NAME")]
    name: Option<String>,
    /// Requests to send [default: 32 synthetic, or the whole trace].
    #[arg(long, value_name = "N")]
    requests: Option<usize>,
    /// Print what each rank would register (identity, layout, formats, pool geometry) and exit
    /// without connecting: what an adapter built from the same settings must register.
    #[arg(long)]
    print_registration: bool,
}

/// What every rank of `inst` registers, and rank 0's pool of `pages` pages.
fn registration(inst: &SimInstance, pages: u32) -> Result<(String, Value), Failure> {
    let refused = |e: orbitkv_state::Error| Failure::refused(e.to_string());
    let layout = inst.layout().map_err(refused)?;
    let formats = (0..inst.workers)
        .map(|r| {
            let reg = inst.registration(Role::Worker, r).map_err(refused)?;
            Ok(reg
                .formats
                .iter()
                .map(|f| hex::encode(f))
                .collect::<Vec<_>>())
        })
        .collect::<Result<Vec<_>, Failure>>()?;
    let spec = inst.pool_spec(1, pages);
    let groups: Vec<Value> = spec
        .groups
        .iter()
        .map(|g| {
            json!({
                "group": g.group, "layers": g.layers, "offset": g.offset,
                "page_stride": g.page_stride, "layer_stride": g.layer_stride,
                "layer_bytes": g.layer_bytes, "parts": g.parts, "part_stride": g.part_stride,
                "layers_inside": g.layers_inside,
            })
        })
        .collect();
    let text = format!(
        "instance: {}\nidentity: {}\nlayout: {} ({} bytes, digest {})\npool: {} pages of {} bytes, {} groups\n",
        inst.name,
        hex::encode(&inst.identity),
        hex::encode(layout.encode()),
        layout.encode().len(),
        hex::encode(&layout.digest()),
        spec.pages,
        spec.page_bytes,
        spec.groups.len()
    );
    let doc = json!({
        "instance": inst.name,
        "identity": hex::encode(&inst.identity),
        "layout": hex::encode(layout.encode()),
        "layout_digest": hex::encode(&layout.digest()),
        "formats": formats,
        "rules": inst.groups().iter().map(|g| json!([g.id, g.rule.name()])).collect::<Vec<_>>(),
        "pool": {"page_bytes": spec.page_bytes, "pages": spec.pages, "aliased": spec.aliased, "groups": groups},
    });
    Ok((text, doc))
}

/// The report's fields shared by `engine-sim` and `loadgen`'s text output.
pub fn report_json(r: &Report) -> Value {
    json!({
        "requests": r.requests,
        "errors": r.errors,
        "hits": r.hits,
        "proven_tokens": r.proven_tokens,
        "requested_tokens": r.requested_tokens,
        "misses": r.misses_by_name(),
        "loaded_pages": r.pages.loaded,
        "loaded_bytes": r.pages.loaded_bytes,
        "published_pages": r.pages.published,
        "published_bytes": r.pages.published_bytes,
        "failed_pages": r.pages.failed,
        "held_pages": r.pages.held,
        "wrong_bytes": r.pages.wrong_bytes,
        "unproven": r.unproven,
        "p50_us": r.percentile_us(50.0),
        "p99_us": r.percentile_us(99.0),
    })
}

/// The report as text lines.
pub fn report_text(r: &Report) -> String {
    let mut t = format!(
        "requests: {} ({} errors)\nhits: {} ({} of {} tokens proven, {:.1} %)\n",
        r.requests,
        r.errors,
        r.hits,
        r.proven_tokens,
        r.requested_tokens,
        100.0 * r.proven_tokens as f64 / r.requested_tokens.max(1) as f64
    );
    for (name, n) in r.misses_by_name() {
        t.push_str(&format!("miss {name}: {n}\n"));
    }
    t.push_str(&format!(
        "pages: {} loaded, {} published, {} failed\nwrong_bytes: {}\nunproven proofs: {}\nlatency: p50 {} us, p99 {} us\n",
        r.pages.loaded,
        r.pages.published,
        r.pages.failed,
        r.pages.wrong_bytes,
        r.unproven,
        r.percentile_us(50.0),
        r.percentile_us(99.0)
    ));
    t
}

/// The failure a report means: wrong bytes or unproven proofs (exit 3), errors (exit 1).
pub fn verdict(r: &Report, error: Option<String>) -> Result<(), Failure> {
    if r.pages.wrong_bytes > 0 || r.unproven > 0 {
        return Err(Failure::with_code(
            EXIT_WRONG,
            format!(
                "{} wrong bytes loaded, {} proofs not what the contract demands",
                r.pages.wrong_bytes, r.unproven
            ),
        ));
    }
    match error {
        Some(e) => Err(Failure::internal(e)),
        None => Ok(()),
    }
}

/// Runs `engine-sim`.
pub fn run(a: &EngineSimArgs, out: &Output) -> Result<(), Failure> {
    let name = a
        .name
        .clone()
        .unwrap_or_else(|| format!("engine-sim-{}", std::process::id()));
    let inst = a.instance.instance(&name)?;
    if a.print_registration {
        let (text, doc) = registration(&inst, a.instance.pool_pages)?;
        return out.emit(&text, || doc);
    }
    let requests = a.instance.requests(a.requests, 32)?;
    if requests.is_empty() {
        return Err(Failure::refused("no requests to send"));
    }
    let mut engine = SimEngine::start(a.instance.options(inst))
        .map_err(|e| Failure::refused(format!("{}: {e}", a.instance.socket.display())))?;
    let mut error = None;
    for i in 0..requests.len() {
        if let Err(e) = engine.run(&requests.tokens(i)) {
            error = Some(format!("request {i}: {e}"));
            break;
        }
    }
    let report = engine.report().clone();
    drop(engine);
    out.emit(
        &format!("instance: {name}\n{}", report_text(&report)),
        || {
            let mut doc = report_json(&report);
            doc["instance"] = json!(name);
            doc
        },
    )?;
    verdict(&report, error)
}
