//! One handler per request. Each returns its reply (or a refusal); [`handle`] sends it and
//! times it. A Publish sends PublishCopied itself and hands its copies to the committer, which
//! sends PublishDurable; a registration is answered when its instance seals.

use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use orbitkv_protocol::message::{LoadRequest, PublishRequest, QueryRequest, Register, Token};
use orbitkv_protocol::{ErrorCode, Message, Role};

use crate::metrics::{Timed, inc};
use crate::session::{ConnId, Refusal};

use super::Shared;
use super::committer::Job;
use super::conn::Conn;

/// What a handler did: a reply to send, or `None` when it answered, or will answer, itself.
type Reply = Option<Message>;

/// Handles one request from `conn`; false closes the connection.
pub(crate) fn handle(
    shared: &Arc<Shared>,
    conn: &Arc<Conn>,
    request: u64,
    msg: Message,
    fds: Vec<OwnedFd>,
) -> bool {
    let started = Instant::now();
    // Which latency histogram the reply is timed into.
    let timed = match &msg {
        Message::Query(_) => Some(Timed::Query),
        Message::Acquire(_) => Some(Timed::Acquire),
        Message::Load(_) => Some(Timed::Load),
        Message::Release { .. } => Some(Timed::Release),
        _ => None,
    };
    let outcome = match msg {
        Message::Hello { .. } => Ok(Some(Message::Welcome {
            server: format!("orbitkv {}", env!("CARGO_PKG_VERSION")),
            max_body: shared.config.max_body,
        })),
        Message::Register(reg) => register(shared, conn, request, reg),
        Message::Stats => Ok(Some(Message::StatsReply {
            text: super::render(shared),
        })),
        Message::Sync => sync(shared),
        Message::Retire { namespace } => retire(shared, namespace),
        Message::Query(q) => query(shared, &q, false),
        Message::Acquire(q) => query(shared, &q, true),
        Message::Release { token, lease } => release(shared, &token, lease),
        Message::RegisterPool {
            token,
            spec,
            memory,
        } => register_pool(shared, conn.id, &token, spec, memory, fds),
        Message::UnregisterPool { token, pool } => unregister_pool(shared, conn.id, &token, pool),
        Message::Load(l) => load(shared, conn.id, &l),
        Message::Publish(p) => publish(shared, conn, request, p, started),
        other => {
            inc(&shared.metrics.malformed);
            conn.outbox.send(
                request,
                &Refusal::new(
                    ErrorCode::Malformed,
                    format!(
                        "message type {:#06x} is a reply, not a request",
                        other.kind()
                    ),
                )
                .message(),
            );
            return false;
        }
    };
    match outcome {
        Ok(None) => return true,
        Ok(Some(m)) => conn.outbox.send(request, &m),
        Err(r) => conn.outbox.send(request, &r.message()),
    };
    if let Some(k) = timed {
        shared.metrics.observe(k, started.elapsed());
    }
    true
}

/// Register: answered when the instance's round seals, times out or is refused.
/// Its bytes count in the connection's memory until it is answered.
fn register(shared: &Shared, conn: &Conn, request: u64, reg: Register) -> Result<Reply, Refusal> {
    let held = reg.held_bytes();
    if !conn.memory.reserve(held) {
        return Err(Refusal::new(
            ErrorCode::LimitExceeded,
            format!(
                "a registration of {held} bytes would pass this connection's memory limit of {} bytes ({} held)",
                conn.memory.limit(),
                conn.memory.used()
            ),
        ));
    }
    conn.register_request.store(request, Ordering::Release);
    let events = shared.sessions().register(conn.id, reg, Instant::now());
    shared.dispatch(events);
    Ok(None)
}

fn sync(shared: &Shared) -> Result<Reply, Refusal> {
    shared
        .store
        .sync()
        .map(|()| Some(Message::Synced))
        .map_err(|e| super::store_refusal(&e, "sync"))
}

/// Retires `namespace`: once answered, no record of it below the watermark reaches any page —
/// its leases have ended, pinned reads refuse it, and no Load that began before is still
/// copying.
fn retire(shared: &Shared, namespace: [u8; 32]) -> Result<Reply, Refusal> {
    let ns = orbitkv_state::Namespace(namespace);
    if !shared.store.namespaces().iter().any(|(n, _, _)| *n == ns) {
        return Err(Refusal::new(
            ErrorCode::UnknownNamespace,
            format!("namespace {ns} is not registered in this store"),
        ));
    }
    let _gate = shared
        .retire_gate
        .write()
        .unwrap_or_else(|e| e.into_inner());
    let watermark = shared
        .store
        .retire_namespace(ns)
        .map_err(|e| super::store_refusal(&e, "retire"))?;
    let ended = shared
        .leases()
        .end_namespace(&shared.store, ns, Instant::now());
    tracing::info!(namespace = %ns, watermark, leases = ended, "namespace retired");
    Ok(Some(Message::Retired { watermark }))
}

/// Query (no side effects) or Acquire (then pins under a lease).
fn query(shared: &Shared, q: &QueryRequest, acquire: bool) -> Result<Reply, Refusal> {
    let session = shared.session(&q.token, Some(q.epoch))?;
    inc(&shared.metrics.queries);
    let (answer, rejected) = crate::query::answer(&session.instance, &shared.store, q)?;
    for r in &rejected {
        shared.metrics.rejection(r);
    }
    let reply = match answer {
        crate::query::Answer::Miss { reason, detail } => {
            shared.metrics.miss(reason);
            Message::Miss { reason, detail }
        }
        crate::query::Answer::Hit { proof, records } => {
            inc(&shared.metrics.hits);
            shared
                .metrics
                .proven_tokens
                .fetch_add(proof.boundary.saturating_sub(q.origin), Ordering::Relaxed);
            if !acquire {
                return Ok(Some(Message::Proof(proof)));
            }
            let ttl = shared.config.lease_ttl;
            let lease =
                shared
                    .leases()
                    .acquire(&shared.store, &session, &records, ttl, Instant::now())?;
            Message::Leased {
                lease,
                ttl_ms: u32::try_from(ttl.as_millis()).unwrap_or(u32::MAX),
                proof,
            }
        }
    };
    Ok(Some(reply))
}

fn release(shared: &Shared, token: &Token, lease: u64) -> Result<Reply, Refusal> {
    let s = shared.session(token, None)?;
    shared.leases().release(&shared.store, lease, &s)?;
    Ok(Some(Message::Released))
}

fn register_pool(
    shared: &Shared,
    id: ConnId,
    token: &Token,
    spec: orbitkv_gpu_bridge::PoolSpec,
    memory: orbitkv_gpu_bridge::PageMemory,
    fds: Vec<OwnedFd>,
) -> Result<Reply, Refusal> {
    let pool = spec.pool;
    let s = shared.session(token, None)?;
    if s.role != Role::Worker {
        return Err(Refusal::new(
            ErrorCode::Malformed,
            "only a worker session registers page pools",
        ));
    }
    let bridge = shared.bridge(id);
    crate::transfer::register_pool(&bridge, &s, spec, memory, fds, shared.config.max_kept_files)?;
    Ok(Some(Message::PoolRegistered { pool }))
}

/// How long an UnregisterPool waits for copies still holding the pool.
const UNREGISTER_WAIT: Duration = Duration::from_secs(5);

fn unregister_pool(
    shared: &Shared,
    id: ConnId,
    token: &Token,
    pool: orbitkv_gpu_bridge::PoolId,
) -> Result<Reply, Refusal> {
    let s = shared.session(token, None)?;
    if s.role != Role::Worker {
        return Err(Refusal::new(
            ErrorCode::Malformed,
            "only a worker session registers page pools",
        ));
    }
    match shared
        .bridge(id)
        .unregister_and_release(pool, UNREGISTER_WAIT)
    {
        Ok(true) => Ok(Some(Message::PoolUnregistered { pool })),
        Ok(false) => Err(Refusal::new(
            ErrorCode::Internal,
            format!(
                "pool {pool}: a copy still held it after {} s; keep its memory until the session closes",
                UNREGISTER_WAIT.as_secs()
            ),
        )),
        Err(e) => Err(Refusal::new(
            ErrorCode::Malformed,
            format!("pool {pool}: {e}"),
        )),
    }
}

fn load(shared: &Shared, id: ConnId, l: &LoadRequest) -> Result<Reply, Refusal> {
    let s = shared.session(&l.token, Some(l.epoch))?;
    let bridge = shared.bridge(id);
    let pages = l
        .pages
        .iter()
        .map(|p| (p.page, p.group, p.layer_start..p.layer_end));
    shared.check_request_bytes("Load", &bridge, pages)?;
    // No retirement completes while this Load copies (see `Shared::retire_gate`).
    let _gate = shared.retire_gate.read().unwrap_or_else(|e| e.into_inner());
    let pins = shared
        .leases()
        .get(l.lease, &s, Instant::now())?
        .pins
        .clone();
    let (pages, moved) = crate::transfer::load(&shared.store, &bridge, l.epoch, &pins, &l.pages);
    shared.metrics.pages(&pages, true);
    shared
        .metrics
        .loaded_bytes
        .fetch_add(moved, Ordering::Relaxed);
    Ok(Some(Message::Loaded { pages }))
}

/// Publish: the pages are copied out and PublishCopied sent at once (the engine may reuse
/// them); the copies go to the committer, which sends PublishDurable once they are stored.
fn publish(
    shared: &Shared,
    conn: &Arc<Conn>,
    request: u64,
    p: PublishRequest,
    started: Instant,
) -> Result<Reply, Refusal> {
    let s = shared.session(&p.token, Some(p.epoch))?;
    let bridge = shared.bridge(conn.id);
    let pages = p.pages.iter().map(|x| (x.page, x.group, 0..u32::MAX));
    let bytes = shared.check_request_bytes("Publish", &bridge, pages)?;
    // The copies stay in the daemon until stored: the connection's memory holds them, each
    // page's frame as built (a header and alignment each, however small the page).
    let frames = shared
        .store
        .frame_footprint(0)
        .saturating_mul(p.pages.len() as u64);
    let reserved = bytes.saturating_add(frames);
    if reserved.saturating_add(u64::from(shared.config.max_body)) > conn.memory.limit()
        || reserved > conn.publishes.limit()
    {
        // It would never fit, however long the client waits.
        return Err(Refusal::new(
            ErrorCode::LimitExceeded,
            format!(
                "a Publish of {bytes} page bytes in {} frames ({reserved} bytes) passes this connection's memory limit of {} bytes, or the daemon's {} bytes for Publishes; split it",
                p.pages.len(),
                conn.memory.limit(),
                conn.publishes.limit()
            ),
        ));
    }
    if !conn.publishes.reserve(reserved) {
        return Err(Refusal::retry_later(
            Duration::ZERO,
            format!(
                "a Publish of {reserved} bytes would pass the daemon's limit of {} bytes of Publishes not yet durable over every connection ({} held); publish it again later",
                conn.publishes.limit(),
                conn.publishes.used()
            ),
        ));
    }
    if !conn.memory.reserve(reserved) {
        conn.publishes.release(reserved);
        return Err(Refusal::retry_later(
            Duration::ZERO,
            format!(
                "a Publish of {bytes} page bytes in {} frames ({reserved} bytes) would pass this connection's memory limit of {} bytes ({} held, most by Publishes not yet durable); publish it again after their PublishDurable",
                p.pages.len(),
                conn.memory.limit(),
                conn.memory.used()
            ),
        ));
    }
    let copied = crate::transfer::copy_out(&bridge, &s, &shared.store, &p.pages, &mut || {
        conn.take_spare()
            .unwrap_or_else(|| shared.store.frame_buf())
    });
    shared
        .metrics
        .published_bytes
        .fetch_add(copied.bytes(), Ordering::Relaxed);
    // The pages may be reused now: nothing reads them again.
    conn.outbox.send(
        request,
        &Message::PublishCopied {
            pages: copied.statuses.clone(),
        },
    );
    shared
        .metrics
        .observe(Timed::PublishCopied, started.elapsed());
    shared.committer.submit(Job {
        conn: conn.clone(),
        request,
        copied,
        reserved,
        started,
    });
    Ok(None)
}
