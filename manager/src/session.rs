//! Sessions and the seal. Every rank of an engine instance — the scheduler and each declared
//! worker — registers with the instance's computation identity, hash domain, storage layout,
//! recovery rules, cache scope and worker count, and its own state formats. The instance
//! **seals** once all have registered and agree: it gets its namespace, its recovery contract
//! and a new session epoch, and each rank a session token. A disagreement refuses the seal for
//! every rank, naming the differing field; a declared rank that never arrives times the seal out.
//! Registering again (an engine restart) starts a new round: once it seals, requests under the
//! old epoch are refused.
//!
//! Pure bookkeeping: callers pass connection ids and the time, and send the [`Event`]s returned.

use std::collections::HashMap;
use std::io::Read;
use std::sync::Arc;
use std::time::{Duration, Instant};

use orbitkv_protocol::message::{Register, Token};
use orbitkv_protocol::{ErrorCode, Message, Role};
use orbitkv_state::{
    CacheGroupId, CacheScope, ComputationIdentity, HashDomain, Namespace, RankSpec,
    RecoveryContract, StateFormat, StorageLayout,
};

/// A client connection, as the server numbers them.
pub type ConnId = u64;

/// A request refused as a whole: the code, when to retry, and a readable account.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// Why.
    pub code: ErrorCode,
    /// For [`ErrorCode::RetryLater`], how long to wait before sending it again.
    pub retry_after: Duration,
    /// What exactly.
    pub detail: String,
}

impl Refusal {
    /// A refusal with `code` (not to be retried as it is).
    pub fn new(code: ErrorCode, detail: impl Into<String>) -> Self {
        Self {
            code,
            retry_after: Duration::ZERO,
            detail: detail.into(),
        }
    }

    /// A refusal the client may send again after `after`.
    pub fn retry_later(after: Duration, detail: impl Into<String>) -> Self {
        Self {
            code: ErrorCode::RetryLater,
            retry_after: after,
            detail: detail.into(),
        }
    }

    /// The error reply.
    pub fn message(&self) -> Message {
        Message::Error {
            code: self.code,
            retry_after_ms: millis(self.retry_after),
            detail: self.detail.clone(),
        }
    }
}

/// `d` in whole milliseconds on the wire, rounded up (a wait is never shortened), saturating.
pub fn millis(d: Duration) -> u32 {
    u32::try_from(d.as_nanos().div_ceil(1_000_000)).unwrap_or(u32::MAX)
}

/// What the server must send after a registration or a timeout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// The instance sealed: `reply` ([`Message::Sealed`]) goes to `conn`.
    Sealed {
        /// The rank's connection.
        conn: ConnId,
        /// The reply.
        reply: Message,
        /// The registration's bytes ([`Register::held_bytes`]), no longer held.
        held: u64,
    },
    /// `conn`'s registration is refused.
    Refused {
        /// The rank's connection.
        conn: ConnId,
        /// Why.
        refusal: Refusal,
        /// The registration's bytes ([`Register::held_bytes`]), no longer held.
        held: u64,
    },
}

/// A sealed instance: what every request under its epoch is checked and answered against.
#[derive(Debug)]
pub struct SealedInstance {
    /// The instance's name.
    pub name: String,
    /// Its epoch.
    pub epoch: u64,
    /// Its namespace.
    pub namespace: Namespace,
    /// Its hash domain.
    pub domain: HashDomain,
    /// Its storage layout.
    pub layout: StorageLayout,
    /// Its recovery contract.
    pub contract: RecoveryContract,
    /// Declared worker ranks.
    pub workers: u32,
    /// The computation identity.
    pub identity: ComputationIdentity,
    /// The model's name, for operators.
    pub model: String,
    /// Its revision, for operators.
    pub revision: String,
}

/// One rank's session.
#[derive(Debug, Clone)]
pub struct Session {
    /// The session id.
    pub id: u64,
    /// Its connection.
    pub conn: ConnId,
    /// Scheduler or worker.
    pub role: Role,
    /// The worker rank (0 for the scheduler).
    pub rank: u32,
    /// The instance as sealed for this session.
    pub instance: Arc<SealedInstance>,
}

struct Pending {
    conn: ConnId,
    reg: Register,
    held: u64,
}

#[derive(Default)]
struct Instance {
    /// Registrations of the round in progress.
    pending: Vec<Pending>,
    /// When the round in progress times out.
    deadline: Option<Instant>,
    /// The epoch sealed last.
    current: Option<u64>,
    /// Whether that epoch's round had no scheduler.
    no_scheduler: bool,
}

/// Where session tokens come from.
pub trait TokenSource: Send {
    /// A fresh unguessable token.
    fn token(&mut self) -> std::io::Result<Token>;
}

/// Tokens from the kernel's random source.
pub struct OsRandom;

impl TokenSource for OsRandom {
    fn token(&mut self) -> std::io::Result<Token> {
        let mut t = [0u8; 32];
        std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut t))?;
        Ok(t)
    }
}

/// The most worker ranks an instance may declare: a larger count is refused before anything
/// is kept (a round is checked and timed out in time linear in it).
pub const MAX_WORKERS: u32 = 1 << 16;

/// The most registrations one connection may hold, pending and sealed together: an engine
/// process registers one or two ranks, and re-registering its own instance replaces its
/// sessions of earlier epochs.
pub const MAX_HELD_PER_CONNECTION: usize = 256;

/// Missing ranks a timeout names before it only counts the rest.
const MISSING_NAMED: usize = 16;

/// Every instance, its rounds and its sessions.
pub struct Sessions {
    instances: HashMap<String, Instance>,
    sessions: HashMap<Token, Session>,
    next_session: u64,
    last_epoch: u64,
    tokens: Box<dyn TokenSource>,
}

impl Sessions {
    /// No instances yet; tokens from `tokens`.
    pub fn new(tokens: Box<dyn TokenSource>) -> Self {
        Self {
            instances: HashMap::new(),
            sessions: HashMap::new(),
            next_session: 1,
            last_epoch: 0,
            tokens,
        }
    }

    /// Takes `conn`'s registration; returns what to send (nothing while the round waits).
    /// Every registration gets one event in the end, which says its bytes are no longer held
    /// (a connection's memory counts them while the round waits), unless its connection closes
    /// first (its memory goes with it).
    pub fn register(&mut self, conn: ConnId, reg: Register, now: Instant) -> Vec<Event> {
        let held = reg.held_bytes();
        if let Err(refusal) = check_alone(&reg) {
            return vec![Event::Refused {
                conn,
                refusal,
                held,
            }];
        }
        if let Some(refusal) = self.name_held_by_another(conn, &reg) {
            return vec![Event::Refused {
                conn,
                refusal,
                held,
            }];
        }
        if self.held_by(conn) >= MAX_HELD_PER_CONNECTION {
            let refusal = Refusal::new(
                ErrorCode::SealRefused,
                format!(
                    "connection {conn} already holds {MAX_HELD_PER_CONNECTION} registrations and sessions"
                ),
            );
            return vec![Event::Refused {
                conn,
                refusal,
                held,
            }];
        }
        if let Some(events) = self.rejoin(conn, &reg, held) {
            return events;
        }
        let inst = self.instances.entry(reg.instance.clone()).or_default();
        if let Some(p) = inst
            .pending
            .iter()
            .find(|p| p.reg.role == reg.role && p.reg.rank == reg.rank)
        {
            let refusal = Refusal::new(
                ErrorCode::SealRefused,
                format!(
                    "{} registered twice for instance {:?} (first on connection {})",
                    who(&reg),
                    reg.instance,
                    p.conn
                ),
            );
            return vec![Event::Refused {
                conn,
                refusal,
                held,
            }];
        }
        if inst.pending.is_empty() {
            inst.deadline = Some(now + Duration::from_millis(u64::from(reg.seal_timeout_ms)));
        }
        inst.pending.push(Pending { conn, reg, held });
        let first = &inst.pending[0].reg;
        // A rank registers at most once (above), so counting the ranks below the declared
        // count tells whether every one has.
        let ranks = inst
            .pending
            .iter()
            .filter(|p| p.reg.role == Role::Worker && p.reg.rank < first.workers)
            .count();
        let complete = (first.no_scheduler
            || inst.pending.iter().any(|p| p.reg.role == Role::Scheduler))
            && ranks == first.workers as usize;
        if !complete {
            return Vec::new();
        }
        let round = std::mem::take(&mut inst.pending);
        inst.deadline = None;
        let regs: Vec<&Register> = round.iter().map(|p| &p.reg).collect();
        match seal(&regs) {
            Err(refusal) => round
                .iter()
                .map(|p| Event::Refused {
                    conn: p.conn,
                    refusal: refusal.clone(),
                    held: p.held,
                })
                .collect(),
            Ok((namespace, domain, layout, contract)) => {
                let epoch = next_epoch(self.last_epoch);
                self.last_epoch = epoch;
                let name = round[0].reg.instance.clone();
                let workers = round[0].reg.workers;
                let (model, revision) = (round[0].reg.model.clone(), round[0].reg.revision.clone());
                let identity = ComputationIdentity::from_digest(round[0].reg.identity);
                if let Some(inst) = self.instances.get_mut(&name) {
                    inst.current = Some(epoch);
                    inst.no_scheduler = round[0].reg.no_scheduler;
                }
                let sealed = Arc::new(SealedInstance {
                    name,
                    epoch,
                    namespace,
                    domain,
                    layout,
                    contract,
                    workers,
                    identity,
                    model,
                    revision,
                });
                // No random source means no safe tokens: refuse rather than issue guessable ones.
                let tokens: std::io::Result<Vec<Token>> =
                    round.iter().map(|_| self.tokens.token()).collect();
                let tokens = match tokens {
                    Ok(t) => t,
                    Err(e) => {
                        let refusal =
                            Refusal::new(ErrorCode::Internal, format!("no session token: {e}"));
                        return round
                            .iter()
                            .map(|p| Event::Refused {
                                conn: p.conn,
                                refusal: refusal.clone(),
                                held: p.held,
                            })
                            .collect();
                    }
                };
                // A connection registering again replaces its sessions of this instance's
                // earlier epochs: no request can use them any more.
                let name = &sealed.name;
                self.sessions.retain(|_, s| {
                    s.instance.name != *name
                        || s.instance.epoch == epoch
                        || !round.iter().any(|p| p.conn == s.conn)
                });
                let mut events = Vec::with_capacity(round.len());
                for (p, token) in round.into_iter().zip(tokens) {
                    let id = self.open_session(token, p.conn, &p.reg, sealed.clone());
                    events.push(Event::Sealed {
                        conn: p.conn,
                        reply: Message::Sealed {
                            session: id,
                            epoch,
                            namespace: namespace.0,
                            token,
                        },
                        held: p.held,
                    });
                }
                events
            }
        }
    }

    /// A rank whose session in its instance's current epoch is gone (its connection closed),
    /// registering again as the sealed computation, joins that epoch at once: the other ranks
    /// keep their sessions, and no round waits for ranks that never register again. `None`
    /// where it does not: a round is in progress, the rank's session lives, or anything of the
    /// registration differs from the seal's (then a new round starts, as before).
    fn rejoin(&mut self, conn: ConnId, reg: &Register, held: u64) -> Option<Vec<Event>> {
        let sealed = self.rejoins(reg)?;
        let (current, namespace) = (sealed.epoch, sealed.namespace);
        let token = match self.tokens.token() {
            Ok(t) => t,
            Err(e) => {
                let refusal = Refusal::new(ErrorCode::Internal, format!("no session token: {e}"));
                return Some(vec![Event::Refused {
                    conn,
                    refusal,
                    held,
                }]);
            }
        };
        // This connection's sessions of the instance's earlier epochs are replaced, as at a seal.
        self.sessions.retain(|_, s| {
            s.instance.name != reg.instance || s.instance.epoch == current || s.conn != conn
        });
        let id = self.open_session(token, conn, reg, sealed);
        Some(vec![Event::Sealed {
            conn,
            reply: Message::Sealed {
                session: id,
                epoch: current,
                namespace: namespace.0,
                token,
            },
            held,
        }])
    }

    /// Opens the session of `reg`'s rank on `conn` under `token`; returns its id.
    fn open_session(
        &mut self,
        token: Token,
        conn: ConnId,
        reg: &Register,
        instance: Arc<SealedInstance>,
    ) -> u64 {
        let id = self.next_session;
        self.next_session += 1;
        let session = Session {
            id,
            conn,
            role: reg.role,
            rank: reg.rank,
            instance,
        };
        self.sessions.insert(token, session);
        id
    }

    /// The sealed instance `reg` would rejoin ([`Sessions::rejoin`]), if it would.
    fn rejoins(&self, reg: &Register) -> Option<Arc<SealedInstance>> {
        let inst = self.instances.get(&reg.instance)?;
        let current = inst.current?;
        if !inst.pending.is_empty() || inst.no_scheduler != reg.no_scheduler {
            return None;
        }
        let of_epoch =
            |s: &&Session| s.instance.name == reg.instance && s.instance.epoch == current;
        let sealed = self.sessions.values().find(of_epoch)?.instance.clone();
        let taken = self
            .sessions
            .values()
            .filter(of_epoch)
            .any(|s| s.role == reg.role && s.rank == reg.rank);
        if taken
            || (&reg.model, &reg.revision) != (&sealed.model, &sealed.revision)
            || reg.workers != sealed.workers
        {
            return None;
        }
        let (namespace, domain, layout, contract) = seal(&[reg]).ok()?;
        let same = (namespace, domain, &layout, &contract)
            == (
                sealed.namespace,
                sealed.domain,
                &sealed.layout,
                &sealed.contract,
            );
        same.then_some(sealed)
    }

    /// After a disconnect: a round in progress whose every registration would now rejoin its
    /// instance's sealed epoch is sealed so. A rank that registered again while the daemon
    /// still served its old connection (a Load it gave up on) found its session alive and
    /// started a round; its old session going frees it, rather than the round's timeout.
    pub fn rejoin_waiting(&mut self) -> Vec<Event> {
        let names: Vec<String> = self
            .instances
            .iter()
            .filter(|(_, i)| !i.pending.is_empty() && i.current.is_some())
            .map(|(n, _)| n.clone())
            .collect();
        let mut events = Vec::new();
        for name in names {
            let Some(inst) = self.instances.get_mut(&name) else {
                continue;
            };
            let pending = std::mem::take(&mut inst.pending);
            let deadline = inst.deadline.take();
            if !pending.iter().all(|p| self.rejoins(&p.reg).is_some()) {
                if let Some(inst) = self.instances.get_mut(&name) {
                    inst.pending = pending;
                    inst.deadline = deadline;
                }
                continue;
            }
            for p in pending {
                let refused = |p: &Pending| Event::Refused {
                    conn: p.conn,
                    refusal: Refusal::new(
                        ErrorCode::SealRefused,
                        "the instance's epoch changed while this rank rejoined it",
                    ),
                    held: p.held,
                };
                match self.rejoin(p.conn, &p.reg, p.held) {
                    Some(e) => events.extend(e),
                    // Not after the check above; answered rather than dropped all the same.
                    None => events.push(refused(&p)),
                }
            }
        }
        events
    }

    /// Times out rounds whose deadline has passed: every rank of such a round is refused,
    /// the missing ranks named.
    pub fn expire(&mut self, now: Instant) -> Vec<Event> {
        let mut events = Vec::new();
        for inst in self.instances.values_mut() {
            if inst.deadline.is_none_or(|d| now < d) || inst.pending.is_empty() {
                continue;
            }
            let round = std::mem::take(&mut inst.pending);
            inst.deadline = None;
            let first = &round[0].reg;
            let mut missing = Vec::new();
            if !first.no_scheduler && !round.iter().any(|p| p.reg.role == Role::Scheduler) {
                missing.push("the scheduler".to_owned());
            }
            let mut present: Vec<u32> = round
                .iter()
                .filter(|p| p.reg.role == Role::Worker)
                .map(|p| p.reg.rank)
                .collect();
            present.sort_unstable();
            let absent = (0..first.workers).filter(|r| present.binary_search(r).is_err());
            let mut unnamed = 0u64;
            for r in absent {
                if missing.len() < MISSING_NAMED {
                    missing.push(format!("worker {r}"));
                } else {
                    unnamed += 1;
                }
            }
            if unnamed > 0 {
                missing.push(format!("{unnamed} more workers"));
            }
            let refusal = Refusal::new(
                ErrorCode::SealTimeout,
                format!(
                    "instance {:?} did not seal within {} ms: {} never registered",
                    first.instance,
                    first.seal_timeout_ms,
                    missing.join(", ")
                ),
            );
            events.extend(round.iter().map(|p| Event::Refused {
                conn: p.conn,
                refusal: refusal.clone(),
                held: p.held,
            }));
        }
        if !events.is_empty() {
            self.forget_idle_instances();
        }
        events
    }

    /// Registrations pending and sessions held by `conn`.
    fn held_by(&self, conn: ConnId) -> usize {
        let pending = self
            .instances
            .values()
            .flat_map(|i| &i.pending)
            .filter(|p| p.conn == conn)
            .count();
        pending + self.sessions.values().filter(|s| s.conn == conn).count()
    }

    /// Forgets instances with no round in progress and no session: names a peer tried and
    /// left, which would otherwise be kept (and walked by the timer) for good.
    fn forget_idle_instances(&mut self) {
        let live: std::collections::HashSet<&str> = self
            .sessions
            .values()
            .map(|s| s.instance.name.as_str())
            .collect();
        self.instances
            .retain(|name, i| !i.pending.is_empty() || live.contains(name.as_str()));
    }

    /// The earliest deadline of a round in progress, for the server's timer.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.instances.values().filter_map(|i| i.deadline).min()
    }

    /// Forgets `conn`: its pending registration and its sessions. Returns the sessions it held.
    pub fn disconnect(&mut self, conn: ConnId) -> Vec<Session> {
        for inst in self.instances.values_mut() {
            inst.pending.retain(|p| p.conn != conn);
            if inst.pending.is_empty() {
                inst.deadline = None;
            }
        }
        let gone: Vec<Token> = self
            .sessions
            .iter()
            .filter(|(_, s)| s.conn == conn)
            .map(|(t, _)| *t)
            .collect();
        let gone = gone
            .iter()
            .filter_map(|t| self.sessions.remove(t))
            .collect();
        self.forget_idle_instances();
        gone
    }

    /// A refusal when `reg`'s instance name is held by a live instance (one with sessions
    /// under its current epoch) of another computation or layout, and `conn` is none of its
    /// ranks' connections: two engine instances sharing a name would seal over each other, so
    /// the second is refused rather than allowed to end the first's epoch. The instance's own
    /// ranks may re-register with another identity (new weights), and a restart of the same
    /// computation may re-seal.
    fn name_held_by_another(&self, conn: ConnId, reg: &Register) -> Option<Refusal> {
        let current = self.instances.get(&reg.instance)?.current?;
        let live: Vec<&Session> = self
            .sessions
            .values()
            .filter(|s| s.instance.name == reg.instance && s.instance.epoch == current)
            .collect();
        if live.iter().any(|s| s.conn == conn) {
            return None;
        }
        let held = &live.first()?.instance;
        let what = if held.identity.digest() != &reg.identity {
            "computation identity"
        } else if held.layout.encode() != reg.layout.as_slice() {
            "storage layout"
        } else {
            return None;
        };
        Some(Refusal::new(
            ErrorCode::SealRefused,
            format!(
                "instance name {:?} is in use by a live instance with another {what} (epoch {current}, {}); \
                 give each engine instance on the node its own name (vLLM: kv_transfer_config.engine_id; \
                 SGLang: the `instance` extra config key)",
                reg.instance, held.identity
            ),
        ))
    }

    /// Sessions now.
    pub fn session_count(&self) -> usize {
        self.sessions.len()
    }

    /// Instance names known now: those with a round in progress or a session.
    pub fn instance_count(&self) -> usize {
        self.instances.len()
    }

    /// The session of `token`, under its instance's current epoch (for requests that carry no
    /// epoch of their own).
    pub fn check_token(&self, token: &Token) -> Result<&Session, Refusal> {
        let epoch = self
            .sessions
            .get(token)
            .map(|s| s.instance.epoch)
            .ok_or_else(|| Refusal::new(ErrorCode::BadToken, "unknown session token"))?;
        self.check(token, epoch)
    }

    /// The session a request under `token` and `epoch` belongs to: refused when the token is
    /// unknown (or forged), or when the epoch is not the one its instance sealed last.
    pub fn check(&self, token: &Token, epoch: u64) -> Result<&Session, Refusal> {
        let s = self
            .sessions
            .get(token)
            .ok_or_else(|| Refusal::new(ErrorCode::BadToken, "unknown session token"))?;
        let current = self
            .instances
            .get(&s.instance.name)
            .and_then(|i| i.current)
            .unwrap_or(0);
        if epoch != s.instance.epoch || epoch != current {
            return Err(Refusal::new(
                ErrorCode::StaleEpoch,
                format!(
                    "epoch {epoch} is not instance {:?}'s current epoch {current}",
                    s.instance.name
                ),
            ));
        }
        Ok(s)
    }
}

/// An epoch above `last`, also above any epoch of an earlier daemon run (milliseconds since
/// 1970, or the next integer when several seal within one millisecond).
fn next_epoch(last: u64) -> u64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0);
    now.max(last + 1)
}

fn who(reg: &Register) -> String {
    match reg.role {
        Role::Scheduler => "the scheduler".to_owned(),
        Role::Worker => format!("worker {}", reg.rank),
    }
}

/// Checks one registration on its own.
fn check_alone(reg: &Register) -> Result<(), Refusal> {
    let bad = |d: String| Err(Refusal::new(ErrorCode::SealRefused, d));
    if reg.workers == 0 {
        return bad("an instance declares at least one worker rank".into());
    }
    if reg.workers > MAX_WORKERS {
        return bad(format!(
            "an instance declares at most {MAX_WORKERS} worker ranks, not {}",
            reg.workers
        ));
    }
    match reg.role {
        Role::Scheduler if reg.no_scheduler => {
            bad("a scheduler registered for an instance declared without one".into())
        }
        Role::Scheduler if reg.rank != 0 => bad("the scheduler registers as rank 0".into()),
        Role::Scheduler if !reg.formats.is_empty() => {
            bad("the scheduler registers no state formats of its own".into())
        }
        Role::Worker if reg.rank >= reg.workers => bad(format!(
            "worker rank {} is not below the declared {} workers",
            reg.rank, reg.workers
        )),
        _ => Ok(()),
    }
}

fn short(b: &[u8]) -> String {
    let digest = orbitkv_state::hex::encode(&b[..b.len().min(8)]);
    format!("{digest}… ({} bytes)", b.len())
}

/// Checks that a complete round agrees, and derives the instance's namespace and contract.
fn seal(
    round: &[&Register],
) -> Result<(Namespace, HashDomain, StorageLayout, RecoveryContract), Refusal> {
    let refuse = |d: String| Refusal::new(ErrorCode::SealRefused, d);
    let Some(first) = round.first() else {
        return Err(refuse("a round of no registration".into()));
    };
    for r in &round[1..] {
        let differ = |field: &str, a: String, b: String| {
            Err(refuse(format!(
                "the ranks disagree on {field}: {} says {a}, {} says {b}",
                who(first),
                who(r)
            )))
        };
        if r.identity != first.identity {
            return differ(
                "the computation identity",
                ComputationIdentity::from_digest(first.identity).to_string(),
                ComputationIdentity::from_digest(r.identity).to_string(),
            );
        }
        if (&r.model, &r.revision) != (&first.model, &first.revision) {
            return differ(
                "the model name and revision",
                format!("{:?} {:?}", first.model, first.revision),
                format!("{:?} {:?}", r.model, r.revision),
            );
        }
        if r.domain != first.domain {
            return differ(
                "the hash domain",
                first.domain.to_string(),
                r.domain.to_string(),
            );
        }
        if r.no_scheduler != first.no_scheduler {
            return differ(
                "whether the instance has a scheduler",
                (!first.no_scheduler).to_string(),
                (!r.no_scheduler).to_string(),
            );
        }
        if r.workers != first.workers {
            return differ(
                "the number of workers",
                first.workers.to_string(),
                r.workers.to_string(),
            );
        }
        if r.scope != first.scope {
            return differ(
                "the cache scope",
                format!("{:?}", first.scope),
                format!("{:?}", r.scope),
            );
        }
        if r.layout != first.layout {
            return differ("the storage layout", short(&first.layout), short(&r.layout));
        }
        if r.rules != first.rules {
            return differ(
                "the recovery rules",
                format!("{:?}", first.rules),
                format!("{:?}", r.rules),
            );
        }
    }
    let layout = StorageLayout::decode(&first.layout)
        .map_err(|e| refuse(format!("the storage layout: {e}")))?;
    let world = layout
        .parallel()
        .world()
        .map_err(|e| refuse(format!("the parallel shape: {e}")))?;
    if world != first.workers {
        return Err(refuse(format!(
            "the layout's parallel shape has {world} ranks but the instance declares {} workers",
            first.workers
        )));
    }
    // Each worker's own formats are the layout's for its rank.
    for r in round.iter().filter(|r| r.role == Role::Worker) {
        if r.formats.len() != layout.groups().len() {
            return Err(refuse(format!(
                "worker {} registered {} state formats for {} cache groups",
                r.rank,
                r.formats.len(),
                layout.groups().len()
            )));
        }
        for (g, bytes) in layout.groups().iter().zip(&r.formats) {
            let own = StateFormat::decode(bytes)
                .map_err(|e| refuse(format!("worker {} group {}: {e}", r.rank, g.id.0)))?;
            let expected = g
                .formats
                .iter()
                .find(|f| f.rank == RankSpec::Rank(r.rank) || f.rank == RankSpec::Replicated);
            if expected != Some(&own) {
                return Err(refuse(format!(
                    "worker {}'s state format for cache group {} differs from the layout's",
                    r.rank, g.id.0
                )));
            }
        }
    }
    let scope = if first.scope.is_empty() {
        None
    } else {
        Some(CacheScope::new(&first.scope).map_err(|e| refuse(format!("the cache scope: {e}")))?)
    };
    let identity = ComputationIdentity::from_digest(first.identity);
    let namespace = Namespace::derive(&identity, &layout, scope.as_ref());
    let rules: Vec<(CacheGroupId, orbitkv_state::Rule)> = first
        .rules
        .iter()
        .map(|(g, r)| (CacheGroupId(*g), *r))
        .collect();
    let contract = RecoveryContract::compile(namespace, first.domain, &layout, &rules)
        .map_err(|e| refuse(format!("the recovery rules: {e}")))?;
    Ok((namespace, first.domain, layout, contract))
}
