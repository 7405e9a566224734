//! A simulated engine instance talking to the daemon exactly as an engine's connector would:
//! its scheduler and one thread per worker rank register (the instance seals), each worker
//! registers a host page pool in shared memory, and every request goes Acquire → Load (each
//! worker into its own pages) → Release → Publish of the blocks it had to compute. Every loaded
//! byte is checked against the bytes the computation produces ([`crate::payload`]), and every
//! proof against what the instance's recovery contract demands at its boundary. A
//! [`PublishObserver`] is told of every Publish and of the pages each PublishDurable acknowledged;
//! [`SimEngine::check`] loads and checks stored records without publishing (crash tests use both).
//!
//! It is over 600 lines: the driver and its worker threads share private job and result types.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::mpsc::{Receiver, Sender, channel};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use orbitkv_gpu_bridge::{HostPool, PageMemory, PageRef};
use orbitkv_state::engine_hash::vllm::{RequestExtras, VllmHashAlgo, VllmHasher};

use crate::instance::{CHECKPOINT_BLOCKS, SimContract, SimGroup, SimInstance, WINDOW_BLOCKS};
use crate::payload;
use orbitkv_protocol::client::{Acquired, Client, ClientError, Seal};
use orbitkv_protocol::message::{
    GroupHashes, LoadPage, LoadRequest, Proof, PublishPage, PublishRequest, QueryRequest, Token,
};
use orbitkv_protocol::{PageStatus, Role};

/// Why the simulated engine stopped.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// A request to the daemon failed or was refused.
    #[error("daemon: {0}")]
    Client(#[from] ClientError),
    /// The instance's description is inconsistent.
    #[error("instance: {0}")]
    State(#[from] orbitkv_state::Error),
    /// The host page pool failed.
    #[error("page pool: {0}")]
    Pool(#[from] orbitkv_gpu_bridge::Error),
    /// The daemon answered with a message the request does not take.
    #[error("unexpected reply to {request}: {reply}")]
    Unexpected {
        /// The request.
        request: &'static str,
        /// What came back.
        reply: String,
    },
    /// A worker thread stopped.
    #[error("worker rank {rank} stopped: {why}")]
    WorkerGone {
        /// Its rank.
        rank: u32,
        /// Why.
        why: String,
    },
}

/// Result alias of the simulated engine.
pub type Result<T> = std::result::Result<T, SimError>;

/// One page a worker published and the daemon acknowledged as stored and durable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AckedPage {
    /// The cache group.
    pub group: u32,
    /// The block's native hash.
    pub hash: Vec<u8>,
    /// The parent block's native hash (empty for the first block and for checkpoints).
    pub parent: Vec<u8>,
    /// First token the record covers.
    pub start: u64,
    /// One past its last token.
    pub end: u64,
}

/// The pages of one Publish that its PublishDurable reply said `ok` for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Acked {
    /// The request (numbered from 0 per engine) the Publish belongs to.
    pub request: u64,
    /// The worker rank that published.
    pub rank: u32,
    /// When the Publish was sent.
    pub sent: Instant,
    /// When PublishDurable came.
    pub durable: Instant,
    /// The acknowledged pages, in request order.
    pub pages: Vec<AckedPage>,
}

/// Told of every Publish a simulated engine's workers send (crash tests record them).
pub trait PublishObserver: Send + Sync {
    /// A Publish of `pages` by `rank` is about to be sent.
    fn sending(&self, rank: u32, pages: &[AckedPage]);
    /// Its PublishDurable came: `acked` holds the pages stored and durable (maybe none).
    fn durable(&self, acked: Acked);
    /// It failed before PublishDurable came (the connection failed, the daemon refused it).
    fn failed(&self, rank: u32);
}

/// A shared [`PublishObserver`].
#[derive(Clone)]
pub struct Observer(pub Arc<dyn PublishObserver>);

impl std::fmt::Debug for Observer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Observer")
    }
}

/// How to run a simulated engine.
#[derive(Debug, Clone)]
pub struct EngineOptions {
    /// The daemon's socket.
    pub socket: PathBuf,
    /// The instance.
    pub instance: SimInstance,
    /// Pages in each worker's pool; longer requests move in several batches.
    pub pool_pages: u32,
    /// Whether the instance publishes what it computes (`false`: a consumer only, as vLLM's
    /// `kv_consumer` role — what it finds depends on other instances alone).
    pub publish: bool,
    /// Fault injection: worker ranks whose publishes are skipped, so their records never exist.
    pub silent_ranks: Vec<u32>,
    /// Told of every Publish and of the pages each PublishDurable acknowledged.
    pub observer: Option<Observer>,
}

impl EngineOptions {
    /// Options for `instance` on `socket`: 1024-page pools, every rank publishing.
    pub fn new(socket: PathBuf, instance: SimInstance) -> Self {
        Self {
            socket,
            instance,
            pool_pages: 1024,
            publish: true,
            silent_ranks: Vec::new(),
            observer: None,
        }
    }
}

/// Pages and bytes moved, for one request or many.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pages {
    /// Pages loaded and checked.
    pub loaded: u64,
    /// Bytes loaded and checked.
    pub loaded_bytes: u64,
    /// Pages published.
    pub published: u64,
    /// Bytes published.
    pub published_bytes: u64,
    /// Pages of a Load or Publish the daemon reported failed.
    pub failed: u64,
    /// Of the pages published, those the daemon holds in DRAM for SSD admission (stored, not
    /// durable).
    pub held: u64,
    /// Loaded bytes that differ from what the computation produces (must be 0).
    pub wrong_bytes: u64,
}

impl Pages {
    /// Adds `other`.
    pub fn add(&mut self, other: &Pages) {
        self.loaded += other.loaded;
        self.loaded_bytes += other.loaded_bytes;
        self.published += other.published;
        self.published_bytes += other.published_bytes;
        self.failed += other.failed;
        self.held += other.held;
        self.wrong_bytes += other.wrong_bytes;
    }
}

/// What one request did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequestOutcome {
    /// Full blocks the request holds.
    pub blocks: u32,
    /// The proven boundary (0 for a miss).
    pub boundary: u64,
    /// The miss reason's code, for a miss.
    pub miss: Option<u16>,
    /// Pages and bytes moved.
    pub pages: Pages,
    /// The proof is not what the contract demands at its boundary (must never happen).
    pub unproven: bool,
    /// Time from the Acquire to the last Publish reply.
    pub micros: u64,
}

/// What a run of requests did, summed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    /// Requests sent.
    pub requests: u64,
    /// Requests with a proven boundary.
    pub hits: u64,
    /// Tokens restored instead of recomputed.
    pub proven_tokens: u64,
    /// Tokens of full blocks requested.
    pub requested_tokens: u64,
    /// Misses by reason code.
    pub misses: BTreeMap<u16, u64>,
    /// Pages and bytes moved (`wrong_bytes` must be 0).
    pub pages: Pages,
    /// Proofs that do not match the contract (must be 0).
    pub unproven: u64,
    /// Requests that failed outright.
    pub errors: u64,
    /// Each request's latency, in microseconds.
    pub latencies_us: Vec<u64>,
}

impl Report {
    /// Adds one request's outcome.
    pub fn add(&mut self, o: &RequestOutcome, block_tokens: u32) {
        self.requests += 1;
        self.requested_tokens += u64::from(o.blocks) * u64::from(block_tokens);
        if o.boundary > 0 {
            self.hits += 1;
            self.proven_tokens += o.boundary;
        }
        if let Some(code) = o.miss {
            *self.misses.entry(code).or_default() += 1;
        }
        self.pages.add(&o.pages);
        self.unproven += u64::from(o.unproven);
        self.latencies_us.push(o.micros);
    }

    /// Adds another report.
    pub fn merge(&mut self, other: &Report) {
        self.requests += other.requests;
        self.hits += other.hits;
        self.proven_tokens += other.proven_tokens;
        self.requested_tokens += other.requested_tokens;
        for (k, v) in &other.misses {
            *self.misses.entry(*k).or_default() += v;
        }
        self.pages.add(&other.pages);
        self.unproven += other.unproven;
        self.errors += other.errors;
        self.latencies_us.extend_from_slice(&other.latencies_us);
    }

    /// The `p`-th percentile latency (nearest rank), 0 without requests.
    pub fn percentile_us(&self, p: f64) -> u64 {
        let mut v = self.latencies_us.clone();
        v.sort_unstable();
        if v.is_empty() {
            return 0;
        }
        let rank = ((p / 100.0) * v.len() as f64).ceil() as usize;
        v[rank.clamp(1, v.len()) - 1]
    }

    /// Misses by reason name (docs/protocol.md, "Miss reasons").
    pub fn misses_by_name(&self) -> BTreeMap<String, u64> {
        self.misses
            .iter()
            .map(|(code, n)| (miss_name(*code), *n))
            .collect()
    }
}

/// The name of miss reason `code` (`reason_<code>` for a code without one).
pub fn miss_name(code: u16) -> String {
    orbitkv_protocol::miss::miss_reason_name(code)
        .map_or_else(|| format!("reason_{code}"), str::to_owned)
}

/// What [`SimEngine::check`] found for one page a proof named.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckedPage {
    /// The cache group.
    pub group: u32,
    /// The rank.
    pub rank: u32,
    /// The block index in the group's hash list.
    pub block: u32,
    /// The Load's status for the page.
    pub status: PageStatus,
    /// Bytes that differ from what the computation produces (for a page loaded `ok`).
    pub wrong_bytes: u64,
}

/// What [`SimEngine::check`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Checked {
    /// The proven boundary (0 for a miss).
    pub boundary: u64,
    /// The miss reason's code, for a miss.
    pub miss: Option<u16>,
    /// Every page the proof named, with its outcome.
    pub pages: Vec<CheckedPage>,
}

/// One page a worker loads or publishes.
#[derive(Debug, Clone)]
struct Item {
    block: u32,
    group: u32,
    hash: Vec<u8>,
    parent: Vec<u8>,
    start: u64,
    end: u64,
}

/// What worker rank `rank` loads of `proof`: each proven block of its rank with its hash (from
/// `hash`, by group and block index); blocks without a hash are left out.
fn load_items(proof: &Proof, rank: u32, hash: &dyn Fn(u32, u32) -> Option<Vec<u8>>) -> Vec<Item> {
    proof
        .loads
        .iter()
        .filter(|l| l.rank == rank)
        .flat_map(|l| {
            l.blocks.iter().filter_map(move |&b| {
                Some(Item {
                    block: b,
                    group: l.group,
                    hash: hash(l.group, b)?,
                    parent: Vec::new(),
                    start: 0,
                    end: 0,
                })
            })
        })
        .collect()
}

enum Job {
    Load {
        epoch: u64,
        lease: u64,
        items: Vec<Item>,
    },
    Publish {
        epoch: u64,
        request: u64,
        items: Vec<Item>,
    },
}

/// A job's result: pages done (and their bytes), pages failed, wrong bytes; for a Load, each
/// item's outcome (group, block, status, wrong bytes), in item order.
#[derive(Debug, Default, Clone)]
struct Done {
    ok: u64,
    bytes: u64,
    failed: u64,
    held: u64,
    wrong_bytes: u64,
    pages: Vec<(u32, u32, PageStatus, u64)>,
    /// The worker's seal, in the first result it sends (once registered).
    seal: Option<Seal>,
}

/// A worker rank: its connection, token and pool.
struct Worker {
    seal: Seal,
    rank: u32,
    inst: SimInstance,
    client: Client,
    token: Token,
    pool: HostPool,
}

impl Worker {
    fn region(&self, group: u32) -> Option<SimGroup> {
        self.inst.groups().into_iter().find(|g| g.id == group)
    }

    fn load(&mut self, epoch: u64, lease: u64, items: &[Item]) -> Result<Done> {
        let mut done = Done::default();
        let chunk = self.pool.spec().pages.max(1) as usize;
        for batch in items.chunks(chunk) {
            let mut pages = Vec::with_capacity(batch.len());
            for (j, it) in batch.iter().enumerate() {
                let g = self.region(it.group).ok_or_else(|| SimError::Unexpected {
                    request: "Acquire",
                    reply: format!("a proof names group {}", it.group),
                })?;
                let page = self.pool.reuse(j as u32)?;
                // Clear the group's bytes: a page the daemon reports loaded must hold them all.
                let len = self.inst.group_page_bytes_at(&g, self.rank) as usize;
                self.pool.write_group(j as u32, g.id, &vec![0u8; len])?;
                pages.push(LoadPage {
                    block: it.block,
                    group: it.group,
                    rank: self.rank,
                    page,
                    layer_start: 0,
                    layer_end: self.inst.rank_layers(self.rank),
                });
            }
            let statuses = self.client.load(LoadRequest {
                token: self.token,
                epoch,
                lease,
                pages,
            })?;
            for (j, (it, st)) in batch.iter().zip(&statuses).enumerate() {
                if *st != PageStatus::Ok {
                    done.failed += 1;
                    done.pages.push((it.group, it.block, *st, 0));
                    continue;
                }
                let Some(g) = self.region(it.group) else {
                    continue;
                };
                let mut got = vec![0u8; self.inst.group_page_bytes_at(&g, self.rank) as usize];
                self.pool.read_group(j as u32, g.id, &mut got)?;
                let wrong =
                    payload::wrong_bytes(&self.inst.identity, it.group, self.rank, &it.hash, &got);
                done.wrong_bytes += wrong;
                done.pages.push((it.group, it.block, *st, wrong));
                done.ok += 1;
                done.bytes += got.len() as u64;
            }
            for it in batch.iter().skip(statuses.len()) {
                done.pages
                    .push((it.group, it.block, PageStatus::Missing, 0));
            }
            done.failed += batch.len().saturating_sub(statuses.len()) as u64;
        }
        Ok(done)
    }

    fn publish(
        &mut self,
        epoch: u64,
        request: u64,
        items: &[Item],
        observer: Option<&Observer>,
    ) -> Result<Done> {
        let mut done = Done::default();
        let chunk = self.pool.spec().pages.max(1) as usize;
        for batch in items.chunks(chunk) {
            let mut pages = Vec::with_capacity(batch.len());
            for (j, it) in batch.iter().enumerate() {
                let Some(g) = self.region(it.group) else {
                    continue;
                };
                let page: PageRef = self.pool.reuse(j as u32)?;
                let bytes = payload::bytes(
                    &self.inst.identity,
                    it.group,
                    self.rank,
                    &it.hash,
                    self.inst.group_page_bytes_at(&g, self.rank) as usize,
                );
                self.pool.write_group(j as u32, g.id, &bytes)?;
                pages.push(PublishPage {
                    group: it.group,
                    rank: self.rank,
                    hash: it.hash.clone(),
                    parent: it.parent.clone(),
                    start: it.start,
                    end: it.end,
                    page,
                });
            }
            // What the observer is told: every page sent, then those acknowledged.
            let mut named: Vec<AckedPage> = Vec::new();
            if let Some(o) = observer {
                named = batch
                    .iter()
                    .map(|it| AckedPage {
                        group: it.group,
                        hash: it.hash.clone(),
                        parent: it.parent.clone(),
                        start: it.start,
                        end: it.end,
                    })
                    .collect();
                o.0.sending(self.rank, &named);
            }
            let sent = Instant::now();
            // The first reply frees the pages; the second says which records are stored.
            let stored = self.client.publish(
                PublishRequest {
                    token: self.token,
                    epoch,
                    pages,
                },
                |_| {},
            );
            let stored = match stored {
                Ok(s) => s,
                Err(e) => {
                    if let Some(o) = observer {
                        o.0.failed(self.rank);
                    }
                    return Err(e.into());
                }
            };
            let durable = Instant::now();
            let mut ok = 0;
            let mut acked = Vec::new();
            for (j, (it, st)) in batch.iter().zip(&stored.pages).enumerate() {
                // `Held` is stored too (in the daemon's DRAM for SSD admission), not durable:
                // only `Ok` is acknowledged.
                if matches!(st, PageStatus::Ok | PageStatus::Held) {
                    ok += 1;
                    done.held += u64::from(*st == PageStatus::Held);
                    done.bytes += self
                        .region(it.group)
                        .map_or(0, |g| self.inst.group_page_bytes_at(&g, self.rank));
                }
                if *st == PageStatus::Ok
                    && let Some(p) = named.get(j)
                {
                    acked.push(p.clone());
                }
            }
            if let Some(o) = observer {
                o.0.durable(Acked {
                    request,
                    rank: self.rank,
                    sent,
                    durable,
                    pages: acked,
                });
            }
            done.ok += ok;
            done.failed += batch.len() as u64 - ok;
        }
        Ok(done)
    }

    fn serve(
        mut self,
        jobs: Receiver<Job>,
        done: Sender<Result<Done>>,
        observer: Option<Observer>,
    ) {
        for job in jobs {
            let r = match job {
                Job::Load {
                    epoch,
                    lease,
                    items,
                } => self.load(epoch, lease, &items),
                Job::Publish {
                    epoch,
                    request,
                    items,
                } => self.publish(epoch, request, &items, observer.as_ref()),
            };
            if done.send(r).is_err() {
                return;
            }
        }
    }
}

/// A worker thread seen from the scheduler.
struct WorkerHandle {
    rank: u32,
    jobs: Option<Sender<Job>>,
    done: Receiver<Result<Done>>,
    thread: Option<JoinHandle<()>>,
}

impl WorkerHandle {
    fn gone(&self, why: &str) -> SimError {
        SimError::WorkerGone {
            rank: self.rank,
            why: why.to_owned(),
        }
    }

    fn submit(&self, job: Job) -> Result<()> {
        self.jobs
            .as_ref()
            .ok_or_else(|| self.gone("closed"))?
            .send(job)
            .map_err(|_| self.gone("its thread ended"))
    }

    fn wait(&self) -> Result<Done> {
        self.done
            .recv()
            .map_err(|_| self.gone("its thread ended"))?
    }
}

fn connect(socket: &std::path::Path, name: &str) -> Result<Client> {
    let mut c = Client::connect(socket)?;
    c.hello(name)?;
    Ok(c)
}

/// Registers `role`/`rank`; returns the seal.
fn register(c: &mut Client, inst: &SimInstance, role: Role, rank: u32) -> Result<Seal> {
    Ok(c.register(inst.registration(role, rank)?)?)
}

/// Starts worker `rank`: registers it, registers its pool, then serves jobs.
fn spawn_worker(opts: &EngineOptions, rank: u32) -> WorkerHandle {
    let (jobs_tx, jobs_rx) = channel();
    let (done_tx, done_rx) = channel();
    let (socket, inst, pages) = (opts.socket.clone(), opts.instance.clone(), opts.pool_pages);
    let observer = opts.observer.clone();
    let thread = std::thread::spawn(move || {
        let setup = (|| -> Result<Worker> {
            let mut client = connect(&socket, "engine-sim worker")?;
            let seal = register(&mut client, &inst, Role::Worker, rank)?;
            let token = seal.token;
            let spec = inst.pool_spec_at(rank, rank + 1, pages);
            let pool = HostPool::create(spec.clone())?;
            client.register_pool(token, spec, PageMemory::Host, pool.fd())?;
            Ok(Worker {
                seal,
                rank,
                inst,
                client,
                token,
                pool,
            })
        })();
        match setup {
            Ok(w) => {
                let first = Done {
                    seal: Some(w.seal),
                    ..Done::default()
                };
                if done_tx.send(Ok(first)).is_ok() {
                    w.serve(jobs_rx, done_tx, observer);
                }
            }
            Err(e) => {
                let _ = done_tx.send(Err(e));
            }
        }
    });
    WorkerHandle {
        rank,
        jobs: Some(jobs_tx),
        done: done_rx,
        thread: Some(thread),
    }
}

/// The loads `inst`'s contract demands at `boundary` of a request of `blocks` full blocks
/// (group, rank, blocks; sorted), or `None` when the contract cannot prove that boundary.
fn demanded(inst: &SimInstance, boundary: u64, blocks: u32) -> Option<Vec<(u32, u32, Vec<u32>)>> {
    let bt = u64::from(inst.block_tokens);
    if boundary == 0 || !boundary.is_multiple_of(bt) || boundary / bt > u64::from(blocks) {
        return None;
    }
    let b = (boundary / bt) as u32;
    let mut out = Vec::new();
    for r in 0..inst.workers {
        match inst.contract {
            SimContract::Dense => out.push((0, r, (0..b).collect())),
            SimContract::Hybrid => {
                if !b.is_multiple_of(CHECKPOINT_BLOCKS) {
                    return None;
                }
                out.push((0, r, (b.saturating_sub(WINDOW_BLOCKS)..b).collect()));
                out.push((1, r, vec![b - 1]));
            }
        }
    }
    out.sort();
    Some(out)
}

/// A sealed simulated engine instance.
pub struct SimEngine {
    opts: EngineOptions,
    scheduler: Client,
    token: Token,
    epoch: u64,
    namespace: [u8; 32],
    hasher: VllmHasher,
    workers: Vec<WorkerHandle>,
    report: Report,
    /// The number the next request gets.
    next_request: u64,
}

impl SimEngine {
    /// Connects every rank, seals the instance and registers each worker's pool.
    pub fn start(opts: EngineOptions) -> Result<Self> {
        let inst = &opts.instance;
        let hasher = VllmHasher::new(VllmHashAlgo::Sha256Cbor, inst.block_tokens as usize, None)?;
        let workers: Vec<WorkerHandle> =
            (0..inst.workers).map(|r| spawn_worker(&opts, r)).collect();
        let mut scheduler = connect(&opts.socket, "engine-sim scheduler")?;
        // Without a scheduler process (as SGLang), the engine's own queries go under worker
        // 0's session, from a connection of their own.
        let own = if inst.no_scheduler {
            None
        } else {
            Some(scheduler.register(inst.registration(Role::Scheduler, 0)?)?)
        };
        let mut seals = Vec::with_capacity(workers.len());
        for w in &workers {
            seals.push(w.wait()?.seal);
        }
        let seal = match own.or(seals.first().copied().flatten()) {
            Some(seal) => seal,
            None => {
                return Err(SimError::Unexpected {
                    request: "Register",
                    reply: "no rank was sealed".into(),
                });
            }
        };
        Ok(Self {
            opts,
            scheduler,
            token: seal.token,
            epoch: seal.epoch,
            namespace: seal.namespace,
            hasher,
            workers,
            report: Report::default(),
            next_request: 0,
        })
    }

    /// The instance.
    pub fn instance(&self) -> &SimInstance {
        &self.opts.instance
    }

    /// The session epoch.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The instance's namespace, as the seal named it.
    pub fn namespace(&self) -> [u8; 32] {
        self.namespace
    }

    /// Checks stored records without publishing: acquires `[origin, end)` of `groups` (each
    /// group's hash list, as a Query names them), loads every page the proof names into the
    /// workers' pages, compares each loaded byte with what the computation produces, and
    /// releases the lease. A proven record that left the store before it was pinned is asked
    /// for again, a few times.
    pub fn check(&mut self, origin: u64, end: u64, groups: Vec<GroupHashes>) -> Result<Checked> {
        let query = QueryRequest {
            token: self.token,
            epoch: self.epoch,
            origin,
            end,
            groups,
        };
        let mut tries = 0;
        let acquired = loop {
            match self.scheduler.acquire(query.clone()) {
                Err(ClientError::Refused {
                    code: orbitkv_protocol::ErrorCode::RetryLater,
                    retry_after,
                    ..
                }) if tries < 8 => {
                    tries += 1;
                    std::thread::sleep(retry_after.max(Duration::from_millis(1)));
                }
                other => break other?,
            }
        };
        let (lease, proof) = match acquired {
            Acquired::Leased { lease, proof, .. } => (lease, proof),
            Acquired::Miss { reason, .. } => {
                return Ok(Checked {
                    miss: Some(reason),
                    ..Checked::default()
                });
            }
        };
        let hash = |group: u32, b: u32| {
            query
                .groups
                .iter()
                .find(|g| g.group == group)
                .and_then(|g| g.hashes.get(b as usize))
                .cloned()
        };
        for w in &self.workers {
            let items = load_items(&proof, w.rank, &hash);
            w.submit(Job::Load {
                epoch: self.epoch,
                lease,
                items,
            })?;
        }
        let mut out = Checked {
            boundary: proof.boundary,
            ..Checked::default()
        };
        for w in &self.workers {
            let d = w.wait()?;
            out.pages
                .extend(
                    d.pages
                        .iter()
                        .map(|&(group, block, status, wrong_bytes)| CheckedPage {
                            group,
                            rank: w.rank,
                            block,
                            status,
                            wrong_bytes,
                        }),
                );
        }
        self.scheduler.release(self.token, lease)?;
        Ok(out)
    }

    /// Everything run so far.
    pub fn report(&self) -> &Report {
        &self.report
    }

    fn proven(&self, proof: &Proof, blocks: u32) -> bool {
        let mut got: Vec<(u32, u32, Vec<u32>)> = proof
            .loads
            .iter()
            .map(|l| (l.group, l.rank, l.blocks.clone()))
            .collect();
        got.sort();
        demanded(&self.opts.instance, proof.boundary, blocks) == Some(got)
    }

    /// The pages to publish after restoring up to `boundary`: every block past it, and (hybrid)
    /// the recurrent state at the last checkpoint of the request.
    fn to_publish(&self, hashes: &[Vec<u8>], boundary: u64) -> Vec<Item> {
        let inst = &self.opts.instance;
        let bt = u64::from(inst.block_tokens);
        let from = (boundary / bt) as usize;
        let mut items: Vec<Item> = (from..hashes.len())
            .map(|i| Item {
                block: i as u32,
                group: 0,
                hash: hashes[i].clone(),
                parent: if i == 0 {
                    Vec::new()
                } else {
                    hashes[i - 1].clone()
                },
                start: i as u64 * bt,
                end: (i as u64 + 1) * bt,
            })
            .collect();
        if inst.contract == SimContract::Hybrid {
            let grid = CHECKPOINT_BLOCKS as usize;
            let c = hashes.len() / grid * grid;
            if c > 0 && c as u64 * bt > boundary {
                items.push(Item {
                    block: c as u32 - 1,
                    group: 1,
                    hash: hashes[c - 1].clone(),
                    parent: Vec::new(),
                    start: (c - grid) as u64 * bt,
                    end: c as u64 * bt,
                });
            }
        }
        items
    }

    /// Runs one request of `tokens`: acquire what the daemon can prove, load and check it,
    /// release, publish the rest.
    pub fn run(&mut self, tokens: &[u64]) -> Result<RequestOutcome> {
        let request = self.next_request;
        self.next_request += 1;
        let r = self.run_inner(tokens, request);
        match &r {
            Ok(o) => self.report.add(o, self.opts.instance.block_tokens),
            Err(_) => self.report.errors += 1,
        }
        r
    }

    fn run_inner(&mut self, tokens: &[u64], request: u64) -> Result<RequestOutcome> {
        let started = Instant::now();
        let hashes = self
            .hasher
            .block_hashes(tokens, 0, None, &RequestExtras::default())?;
        let blocks = hashes.len() as u32;
        let mut out = RequestOutcome {
            blocks,
            ..RequestOutcome::default()
        };
        if hashes.is_empty() {
            return Ok(out);
        }
        let bt = u64::from(self.opts.instance.block_tokens);
        let query = QueryRequest {
            token: self.token,
            epoch: self.epoch,
            origin: 0,
            end: u64::from(blocks) * bt,
            groups: self
                .opts
                .instance
                .groups()
                .iter()
                .map(|g| GroupHashes {
                    group: g.id,
                    hashes: hashes.clone(),
                })
                .collect(),
        };
        match self.scheduler.acquire(query)? {
            Acquired::Leased { lease, proof, .. } => {
                out.unproven = !self.proven(&proof, blocks);
                for w in &self.workers {
                    let items = load_items(&proof, w.rank, &|_, b| hashes.get(b as usize).cloned());
                    w.submit(Job::Load {
                        epoch: self.epoch,
                        lease,
                        items,
                    })?;
                }
                for w in &self.workers {
                    let d = w.wait()?;
                    out.pages.loaded += d.ok;
                    out.pages.loaded_bytes += d.bytes;
                    out.pages.failed += d.failed;
                    out.pages.wrong_bytes += d.wrong_bytes;
                }
                self.scheduler.release(self.token, lease)?;
                out.boundary = proof.boundary;
            }
            Acquired::Miss { reason, .. } => out.miss = Some(reason),
        }
        let items = if self.opts.publish {
            self.to_publish(&hashes, out.boundary)
        } else {
            Vec::new()
        };
        let mut publishing = Vec::new();
        for w in &self.workers {
            if self.opts.silent_ranks.contains(&w.rank) || items.is_empty() {
                continue;
            }
            w.submit(Job::Publish {
                epoch: self.epoch,
                request,
                items: items.clone(),
            })?;
            publishing.push(w);
        }
        for w in publishing {
            let d = w.wait()?;
            out.pages.published += d.ok;
            out.pages.published_bytes += d.bytes;
            out.pages.failed += d.failed;
            out.pages.held += d.held;
        }
        out.micros = started.elapsed().as_micros() as u64;
        Ok(out)
    }
}

impl Drop for SimEngine {
    fn drop(&mut self) {
        for w in &mut self.workers {
            w.jobs = None;
        }
        for w in &mut self.workers {
            if let Some(t) = w.thread.take() {
                let _ = t.join();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_contract_demands_every_rank_and_the_window_and_checkpoint_at_a_boundary() {
        let dense = SimInstance::new("d", 2);
        assert_eq!(
            demanded(&dense, 32, 4),
            Some(vec![(0, 0, vec![0, 1]), (0, 1, vec![0, 1])])
        );
        assert_eq!(demanded(&dense, 24, 4), None, "off the block grid");
        assert_eq!(demanded(&dense, 80, 4), None, "past the request");
        assert_eq!(demanded(&dense, 0, 4), None, "nothing");
        let mut hybrid = SimInstance::new("h", 1);
        hybrid.contract = SimContract::Hybrid;
        assert_eq!(demanded(&hybrid, 48, 8), None, "no checkpoint at 3 blocks");
        assert_eq!(
            demanded(&hybrid, 128, 8),
            Some(vec![(0, 0, vec![5, 6, 7]), (1, 0, vec![7])])
        );
    }
}
