//! A connection to the daemon with many requests outstanding: each `submit_*` sends a request
//! and returns its id at once; `poll` takes a reply if one has come, `wait` blocks (without the
//! GIL) until one does. The typed calls (`query`, `publish`, ...) are a submit and a wait.
//!
//! Replies are read leader/follower: a waiting thread reads the socket itself when no other
//! thread is reading it, filing each reply under its request's id, so a round trip costs no
//! thread hop; others wait for the reader to file theirs. A drainer thread reads what has
//! arrived every [`DRAIN_EVERY`] while nobody waits, so the daemon never finds the connection
//! unread (it disconnects a peer whose replies stay queued).

use std::collections::{HashMap, HashSet, VecDeque};
use std::io::Write;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use pyo3::prelude::*;
use pyo3::types::PyBytes;

use orbitkv_gpu_bridge::fdpass::send_with_fds;
use orbitkv_gpu_bridge::{PageMemory, PageRef, PoolId};
use orbitkv_protocol::message::{
    GroupHashes, LoadPage, LoadRequest, MAX_NAME, Proof as WireProof, PublishPage, PublishRequest,
    QueryRequest, Register, Token,
};
use orbitkv_protocol::{DEFAULT_MAX_BODY, Message, PageStatus, Role, discover, read_frame};
use orbitkv_state::HashDomain;

use crate::errors::{DaemonNotFound, TimedOut, error, invalid, lost, refused, violation};
use crate::fd_unsafe::{readable, with_borrowed};
use crate::layout::rule;
use crate::pool::HostPool;

/// A Load's page from Python: `(block, group, rank, pool, index, generation, layer_start,
/// layer_end)`.
type LoadTuple = (u32, u32, u32, u32, u32, u64, u32, u32);

/// A Publish's page from Python: `(group, rank, hash, parent, start, end, pool, index,
/// generation)`.
type PublishTuple = (u32, u32, Vec<u8>, Vec<u8>, u64, u64, u32, u32, u64);

/// How often the drainer reads what has arrived while nobody waits.
const DRAIN_EVERY: Duration = Duration::from_millis(10);

/// Replies filed so far, by request id.
#[derive(Default)]
struct Inbox {
    replies: HashMap<u64, VecDeque<Message>>,
    /// Requests whose replies are dropped on arrival.
    forgotten: HashSet<u64>,
    /// Why the connection ended, once it has.
    closed: Option<String>,
    /// A thread is reading the socket (the leader).
    reading: bool,
    /// The drainer stops.
    stopping: bool,
}

impl Inbox {
    fn take(&mut self, request: u64) -> Option<Message> {
        let q = self.replies.get_mut(&request)?;
        let m = q.pop_front();
        if q.is_empty() {
            self.replies.remove(&request);
        }
        m
    }

    fn file(&mut self, request: u64, m: Message) {
        if self.forgotten.contains(&request) {
            // A Publish's first reply is not its last.
            if !matches!(m, Message::PublishCopied { .. }) {
                self.forgotten.remove(&request);
            }
            return;
        }
        self.replies.entry(request).or_default().push_back(m);
    }
}

struct Shared {
    inbox: Mutex<Inbox>,
    /// A reply was filed, or the leader gave up reading.
    arrived: Condvar,
    /// The drainer's timer (woken early only to stop).
    tick: Condvar,
    /// The read side of the socket, read only by the leader.
    stream: UnixStream,
    max_body: u32,
}

impl Shared {
    fn inbox(&self) -> MutexGuard<'_, Inbox> {
        self.inbox.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Reads one frame as the leader, once the socket is readable within `wait` (`None`: no
    /// limit): `Ok(None)` when nothing came in time; `Err` why the connection ended.
    fn read_one(&self, wait: Option<Duration>) -> Result<Option<(u64, Message)>, String> {
        // Without a limit the read itself waits: a sleep in poll(2) first costs a second
        // wakeup per reply.
        if wait.is_some() {
            match readable(&self.stream, wait) {
                Ok(false) => return Ok(None),
                Ok(true) => {}
                Err(e) => return Err(format!("connection: {e}")),
            }
        }
        let (h, body) =
            read_frame(&mut &self.stream, self.max_body).map_err(|e| format!("connection: {e}"))?;
        let m = Message::decode(h.kind, &body).map_err(|e| format!("protocol: {e}"))?;
        if h.request == 0 {
            // A connection-level error: the daemon closes the connection after it.
            return Err(match m {
                Message::Error { code, detail, .. } => {
                    format!(
                        "the daemon ended the connection ({}): {detail}",
                        code.name()
                    )
                }
                other => format!("an unrequested message of type {:#06x}", other.kind()),
            });
        }
        Ok(Some((h.request, m)))
    }

    /// As the leader (taken, held by the caller), files every frame already readable; returns
    /// with the inbox locked and leadership given up.
    fn drain(&self) -> MutexGuard<'_, Inbox> {
        let mut got = Vec::new();
        let end = loop {
            match self.read_one(Some(Duration::ZERO)) {
                Ok(Some(f)) => got.push(f),
                Ok(None) => break None,
                Err(why) => break Some(why),
            }
        };
        let mut inbox = self.inbox();
        for (r, m) in got {
            inbox.file(r, m);
        }
        if let Some(why) = end {
            inbox.closed.get_or_insert(why);
        }
        inbox.reading = false;
        self.arrived.notify_all();
        inbox
    }
}

/// The drainer: while the connection is open, reads what has arrived whenever nobody else is
/// reading, every [`DRAIN_EVERY`].
fn drainer(shared: &Shared) {
    let mut inbox = shared.inbox();
    loop {
        if inbox.stopping || inbox.closed.is_some() {
            return;
        }
        inbox = shared
            .tick
            .wait_timeout(inbox, DRAIN_EVERY)
            .unwrap_or_else(|e| e.into_inner())
            .0;
        if inbox.reading || inbox.stopping || inbox.closed.is_some() {
            continue;
        }
        inbox.reading = true;
        drop(inbox);
        inbox = shared.drain();
    }
}

/// Why a request was not sent.
enum Unsent {
    /// It cannot be encoded (a field past its bounds).
    Bad(String),
    /// The socket failed.
    Io(std::io::Error),
}

struct Sender {
    stream: UnixStream,
    next: u64,
}

/// A connection to the OrbitKV daemon. Thread-safe: any thread may submit and wait.
///
/// `Connection(socket=None)` finds the daemon as every adapter does: `socket` when given, else
/// `ORBITKV_SOCKET`, else `./orbitkv-data/orbitkv.sock` where it exists, else
/// `/run/orbitkv/orbitkv.sock`; `DaemonNotFound` lists the paths tried. A daemon that does not
/// answer the handshake within `handshake_timeout` seconds is `ConnectionLost`.
///
/// Every submitted request's replies must be taken (`wait`, `poll`) or dropped (`forget`):
/// the connection keeps them until then.
#[pyclass(frozen, module = "orbitkv._native")]
pub struct Connection {
    sender: Mutex<Sender>,
    shared: Arc<Shared>,
    socket: PathBuf,
    server: String,
    drainer: Mutex<Option<JoinHandle<()>>>,
}

/// What `wait` and `poll` return, by reply.
fn to_python(py: Python<'_>, m: Message) -> PyResult<Py<PyAny>> {
    let obj: Py<PyAny> = match m {
        Message::Sealed {
            session,
            epoch,
            namespace,
            token,
        } => Py::new(
            py,
            Sealed {
                session,
                epoch,
                namespace,
                token,
            },
        )?
        .into_any(),
        Message::PoolRegistered { pool } => {
            Py::new(py, PoolRegistered { pool: pool.0 })?.into_any()
        }
        Message::Proof(p) => Py::new(py, Proof::from(p))?.into_any(),
        Message::Miss { reason, detail } => Py::new(py, Miss::new(reason, detail))?.into_any(),
        Message::Leased {
            lease,
            ttl_ms,
            proof,
        } => Py::new(
            py,
            Leased {
                lease,
                ttl_ms,
                proof: Proof::from(proof),
            },
        )?
        .into_any(),
        Message::Loaded { pages } => Py::new(py, Pages::new("loaded", &pages, 0))?.into_any(),
        Message::PublishCopied { pages } => {
            Py::new(py, Pages::new("copied", &pages, 0))?.into_any()
        }
        Message::PublishDurable {
            pages,
            retry_after_ms,
        } => Py::new(py, Pages::new("durable", &pages, retry_after_ms))?.into_any(),
        Message::Released => Py::new(py, Done::new("released"))?.into_any(),
        Message::Synced => Py::new(py, Done::new("synced"))?.into_any(),
        Message::StatsReply { text } => text.into_pyobject(py)?.into_any().unbind(),
        Message::Error {
            code,
            retry_after_ms,
            detail,
        } => return Err(refused(py, code, retry_after_ms, &detail)),
        other => {
            return Err(violation(
                py,
                format!("a reply of type {:#06x} no request takes", other.kind()),
            ));
        }
    };
    Ok(obj)
}

fn token(py: Python<'_>, t: &[u8]) -> PyResult<Token> {
    Token::try_from(t)
        .map_err(|_| invalid(py, format!("token: 32 bytes expected, got {}", t.len())))
}

impl Connection {
    fn send(&self, py: Python<'_>, m: &Message) -> PyResult<u64> {
        // All without the GIL: a daemon slow to read holds up only this thread, and no thread
        // ever holds the sender while it waits for the GIL (that would deadlock against one
        // holding the GIL while it waits for the sender).
        let sent = py.detach(|| {
            let mut s = self.sender.lock().unwrap_or_else(|e| e.into_inner());
            let id = s.next;
            s.next += 1;
            let frame = m.encode_frame(id).map_err(|e| Unsent::Bad(e.to_string()))?;
            s.stream.write_all(&frame).map_err(Unsent::Io)?;
            Ok(id)
        });
        sent.map_err(|e| match e {
            Unsent::Io(e) => lost(py, format!("sending to {}: {e}", self.socket.display())),
            Unsent::Bad(e) => invalid(py, format!("request: {e}")),
        })
    }

    /// Sends `m` with descriptors beside it; the GIL is held throughout (see
    /// [`with_borrowed`]): the sender's holders never wait for the GIL, so this cannot deadlock.
    fn send_with(&self, py: Python<'_>, m: &Message, fds: &[i32]) -> PyResult<u64> {
        let mut s = self.sender.lock().unwrap_or_else(|e| e.into_inner());
        let id = s.next;
        s.next += 1;
        let frame = m
            .encode_frame(id)
            .map_err(|e| invalid(py, format!("request: {e}")))?;
        let sent = match fds {
            [a] => with_borrowed(*a, |a| send_with_fds(&s.stream, &frame, &[a])),
            [a, b] => with_borrowed(*a, |a| {
                with_borrowed(*b, |b| send_with_fds(&s.stream, &frame, &[a, b]))
            })
            .flatten(),
            _ => return Err(invalid(py, "one or two descriptors")),
        };
        match sent {
            None => Err(invalid(py, format!("descriptors {fds:?}: not open"))),
            Some(Err(e)) => Err(lost(
                py,
                format!("sending to {}: {e}", self.socket.display()),
            )),
            Some(Ok(())) => Ok(id),
        }
    }

    /// The next reply to `request`, waiting at most `timeout` (None: until it comes or the
    /// connection ends), without the GIL: read by this thread itself while no other reads.
    fn next_reply(&self, py: Python<'_>, request: u64, timeout: Option<f64>) -> PyResult<Message> {
        let deadline = match timeout {
            Some(t) if t.is_finite() && t >= 0.0 => {
                Some(Instant::now() + Duration::from_secs_f64(t))
            }
            Some(t) => return Err(invalid(py, format!("timeout {t}: seconds, at least 0"))),
            None => None,
        };
        let shared = &*self.shared;
        let got = py.detach(|| {
            let mut inbox = shared.inbox();
            loop {
                if let Some(m) = inbox.take(request) {
                    return Ok(m);
                }
                if let Some(why) = &inbox.closed {
                    return Err(Some(why.clone()));
                }
                let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
                if !inbox.reading {
                    // Lead: read one frame, file it, let the others look.
                    inbox.reading = true;
                    drop(inbox);
                    let read = shared.read_one(left);
                    inbox = shared.inbox();
                    inbox.reading = false;
                    match read {
                        Ok(Some((r, m))) => inbox.file(r, m),
                        Ok(None) => {}
                        Err(why) => {
                            inbox.closed.get_or_insert(why);
                        }
                    }
                    shared.arrived.notify_all();
                    if left.is_some_and(|l| l.is_zero()) && !inbox.replies.contains_key(&request) {
                        return Err(None);
                    }
                    continue;
                }
                // Follow: the leader files what it reads and wakes everyone.
                inbox = match left {
                    None => shared
                        .arrived
                        .wait(inbox)
                        .unwrap_or_else(|e| e.into_inner()),
                    Some(l) if l.is_zero() => return Err(None),
                    Some(l) => {
                        shared
                            .arrived
                            .wait_timeout(inbox, l)
                            .unwrap_or_else(|e| e.into_inner())
                            .0
                    }
                };
            }
        });
        got.map_err(|why| match why {
            Some(why) => lost(py, why),
            None => error::<TimedOut>(
                py,
                "timed_out",
                true,
                0.0,
                format!("no reply to request {request} within {timeout:?} s"),
            ),
        })
    }

    fn wait_message(
        &self,
        py: Python<'_>,
        request: u64,
        timeout: Option<f64>,
    ) -> PyResult<Message> {
        match self.next_reply(py, request, timeout)? {
            Message::Error {
                code,
                retry_after_ms,
                detail,
            } => Err(refused(py, code, retry_after_ms, &detail)),
            m => Ok(m),
        }
    }
}

fn unexpected(py: Python<'_>, m: &Message, wanted: &str) -> PyErr {
    violation(
        py,
        format!("a reply of type {:#06x} where {wanted} was due", m.kind()),
    )
}

fn query_request(
    py: Python<'_>,
    tok: &[u8],
    epoch: u64,
    origin: u64,
    end: u64,
    groups: Vec<(u32, Vec<Vec<u8>>)>,
) -> PyResult<QueryRequest> {
    Ok(QueryRequest {
        token: token(py, tok)?,
        epoch,
        origin,
        end,
        groups: groups
            .into_iter()
            .map(|(group, hashes)| GroupHashes { group, hashes })
            .collect(),
    })
}

#[pymethods]
impl Connection {
    #[new]
    #[pyo3(signature = (socket = None, *, client = "orbitkv-python", handshake_timeout = 10.0))]
    fn new(
        py: Python<'_>,
        socket: Option<PathBuf>,
        client: &str,
        handshake_timeout: f64,
    ) -> PyResult<Self> {
        let (mut stream, path) =
            py.detach(|| discover::connect(socket.as_deref()))
                .map_err(|e| {
                    let err =
                        error::<DaemonNotFound>(py, "daemon_not_found", true, 0.0, e.to_string());
                    let tried: Vec<String> = e
                        .tried
                        .iter()
                        .map(|(p, _)| p.display().to_string())
                        .collect();
                    let _ = err.value(py).setattr("tried", tried);
                    err
                })?;
        let hello = Message::Hello {
            client: client.to_owned(),
            pid: std::process::id(),
        }
        .encode_frame(1)
        .map_err(|e| invalid(py, format!("client name: {e}")))?;
        // Something else listening there, or a daemon that never answers, ends the handshake
        // after `handshake_timeout` rather than hanging the engine's start-up.
        let limit = match handshake_timeout {
            t if t.is_finite() && t > 0.0 => Duration::from_secs_f64(t),
            t => {
                return Err(invalid(
                    py,
                    format!("handshake_timeout {t}: seconds, above 0"),
                ));
            }
        };
        let welcome = py.detach(|| -> Result<Message, String> {
            stream
                .set_read_timeout(Some(limit))
                .map_err(|e| e.to_string())?;
            stream.write_all(&hello).map_err(|e| e.to_string())?;
            let (h, body) = read_frame(&mut stream, DEFAULT_MAX_BODY).map_err(|e| e.to_string())?;
            stream.set_read_timeout(None).map_err(|e| e.to_string())?;
            Message::decode(h.kind, &body).map_err(|e| e.to_string())
        });
        let (server, max_body) = match welcome {
            Ok(Message::Welcome { server, max_body }) => (server, max_body.max(DEFAULT_MAX_BODY)),
            Ok(Message::Error {
                code,
                retry_after_ms,
                detail,
            }) => return Err(refused(py, code, retry_after_ms, &detail)),
            Ok(other) => return Err(unexpected(py, &other, "Welcome")),
            Err(e) => return Err(lost(py, format!("{}: {e}", path.display()))),
        };
        let read_half = stream
            .try_clone()
            .map_err(|e| lost(py, format!("{}: {e}", path.display())))?;
        let shared = Arc::new(Shared {
            inbox: Mutex::new(Inbox::default()),
            arrived: Condvar::new(),
            tick: Condvar::new(),
            stream: read_half,
            max_body,
        });
        let drainer = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("orbitkv-drainer".into())
                .spawn(move || drainer(&shared))
                .map_err(|e| lost(py, format!("no drainer thread: {e}")))?
        };
        Ok(Self {
            sender: Mutex::new(Sender { stream, next: 2 }),
            shared,
            socket: path,
            server,
            drainer: Mutex::new(Some(drainer)),
        })
    }

    /// The socket this connection answered at.
    #[getter]
    fn socket(&self) -> String {
        self.socket.display().to_string()
    }

    /// The daemon's version, from its Welcome.
    #[getter]
    fn server(&self) -> &str {
        &self.server
    }

    /// Why the connection ended, or None while it is open.
    #[getter]
    fn closed(&self) -> Option<String> {
        self.shared.inbox().closed.clone()
    }

    /// Closes the connection (idempotent): outstanding waits end with `ConnectionLost`.
    fn close(&self, py: Python<'_>) {
        self.shut();
        let drainer = self
            .drainer
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(d) = drainer {
            py.detach(|| {
                let _ = d.join();
            });
        }
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __exit__(
        &self,
        py: Python<'_>,
        _ty: Option<&Bound<'_, PyAny>>,
        _value: Option<&Bound<'_, PyAny>>,
        _tb: Option<&Bound<'_, PyAny>>,
    ) {
        self.close(py);
    }

    /// The next reply to `request`: `Sealed`, `PoolRegistered`, `Proof`, `Miss`, `Leased`,
    /// `Pages` (Loaded, PublishCopied, PublishDurable), `Done` (Released, Synced) or the
    /// stats text; a refusal raises `RefusedError`. Waits at most `timeout` seconds (None:
    /// until it comes), without holding the GIL.
    #[pyo3(signature = (request, timeout = None))]
    fn wait(&self, py: Python<'_>, request: u64, timeout: Option<f64>) -> PyResult<Py<PyAny>> {
        let m = self.next_reply(py, request, timeout)?;
        to_python(py, m)
    }

    /// The next reply to `request` if one has come, else None (never blocks: it reads what has
    /// arrived when no other thread is reading).
    fn poll(&self, py: Python<'_>, request: u64) -> PyResult<Option<Py<PyAny>>> {
        let shared = &*self.shared;
        let m = py.detach(|| {
            let mut inbox = shared.inbox();
            if !inbox.replies.contains_key(&request) && !inbox.reading && inbox.closed.is_none() {
                inbox.reading = true;
                drop(inbox);
                inbox = shared.drain();
            }
            match (inbox.take(request), &inbox.closed) {
                (Some(m), _) => Ok(Some(m)),
                (None, Some(why)) => Err(why.clone()),
                (None, None) => Ok(None),
            }
        });
        match m {
            Ok(Some(m)) => to_python(py, m).map(Some),
            Ok(None) => Ok(None),
            Err(why) => Err(lost(py, why)),
        }
    }

    /// Drops `request`'s replies, those come and those to come.
    fn forget(&self, request: u64) {
        let mut inbox = self.shared.inbox();
        inbox.replies.remove(&request);
        inbox.forgotten.insert(request);
    }

    /// Sends a rank's Register; returns its request id (its reply, `Sealed`, comes once the
    /// instance seals: `await_seal`). `role` is `scheduler` or `worker`; `domain` the engine's
    /// hash scheme (`vllm/sha256_cbor`, `vllm/xxhash_cbor`, `vllm/sha256`, `sglang/sha256`);
    /// `rules` one `(group, rule, parameter)` per group (`prefix`, `window`, `checkpoint`);
    /// `formats` this rank's encoded state format per group, in the layout's group order (none
    /// for the scheduler).
    #[pyo3(signature = (*, instance, role, rank, workers, identity, layout, domain, rules,
        formats = Vec::new(), model = String::new(), revision = String::new(),
        scope = String::new(), seal_timeout_ms = 60_000, no_scheduler = false))]
    #[expect(
        clippy::too_many_arguments,
        reason = "keyword arguments of a Python method"
    )]
    fn submit_register(
        &self,
        py: Python<'_>,
        instance: String,
        role: &str,
        rank: u32,
        workers: u32,
        identity: Vec<u8>,
        layout: Vec<u8>,
        domain: &str,
        rules: Vec<(u32, String, u64)>,
        formats: Vec<Vec<u8>>,
        model: String,
        revision: String,
        scope: String,
        seal_timeout_ms: u32,
        no_scheduler: bool,
    ) -> PyResult<u64> {
        if instance.is_empty() || instance.len() > MAX_NAME {
            return Err(invalid(
                py,
                format!("instance name {instance:?}: 1 to {MAX_NAME} bytes"),
            ));
        }
        let role = match role {
            "scheduler" => Role::Scheduler,
            "worker" => Role::Worker,
            other => return Err(invalid(py, format!("role {other:?}: scheduler or worker"))),
        };
        let identity = <[u8; 32]>::try_from(identity.as_slice()).map_err(|_| {
            invalid(
                py,
                format!("identity: 32 bytes expected, got {}", identity.len()),
            )
        })?;
        let domain = HashDomain::from_name(domain).map_err(|e| invalid(py, e.to_string()))?;
        let rules = rules
            .iter()
            .map(|(g, name, param)| Ok((*g, rule(py, name, *param)?)))
            .collect::<PyResult<Vec<_>>>()?;
        self.send(
            py,
            &Message::Register(Register {
                instance,
                role,
                rank,
                workers,
                identity,
                model,
                revision,
                domain,
                layout,
                rules,
                scope,
                formats,
                seal_timeout_ms,
                no_scheduler,
            }),
        )
    }

    /// Waits for the seal of the Register sent as `request`: returns `Sealed`; a refused or
    /// timed-out seal raises `RefusedError` naming why.
    #[pyo3(signature = (request, timeout = None))]
    fn await_seal(
        &self,
        py: Python<'_>,
        request: u64,
        timeout: Option<f64>,
    ) -> PyResult<Py<PyAny>> {
        match self.wait_message(py, request, timeout)? {
            m @ Message::Sealed { .. } => to_python(py, m),
            other => Err(unexpected(py, &other, "Sealed")),
        }
    }

    /// Registers `pool` (a host pool in its own memfd) under the worker session `token`.
    fn register_pool(&self, py: Python<'_>, token: Vec<u8>, pool: &HostPool) -> PyResult<u32> {
        let m = Message::RegisterPool {
            token: self::token(py, &token)?,
            spec: pool.inner.spec().clone(),
            memory: PageMemory::Host,
        };
        let fd = std::os::fd::AsRawFd::as_raw_fd(&pool.inner.fd());
        let id = self.send_with(py, &m, &[fd])?;
        self.pool_registered(py, id)
    }

    /// Registers a pool whose pages are memory the engine allocated itself: `states`, a
    /// `HostPool(spec, states_only=True)`, and `memory_fd`, a descriptor of that memory
    /// holding page 0 at `offset`.
    fn register_engine_memory_pool(
        &self,
        py: Python<'_>,
        token: Vec<u8>,
        states: &HostPool,
        memory_fd: i32,
        offset: u64,
    ) -> PyResult<u32> {
        let m = Message::RegisterPool {
            token: self::token(py, &token)?,
            spec: states.inner.spec().clone(),
            memory: PageMemory::Engine { offset },
        };
        let fd = std::os::fd::AsRawFd::as_raw_fd(&states.inner.fd());
        let id = self.send_with(py, &m, &[fd, memory_fd])?;
        self.pool_registered(py, id)
    }

    /// Sends a Query (no side effects); its reply is `Proof` or `Miss`. `groups` is one
    /// `(group, [block hash, ...])` per cache group, block 0 first.
    fn submit_query(
        &self,
        py: Python<'_>,
        token: Vec<u8>,
        epoch: u64,
        origin: u64,
        end: u64,
        groups: Vec<(u32, Vec<Vec<u8>>)>,
    ) -> PyResult<u64> {
        let q = query_request(py, &token, epoch, origin, end, groups)?;
        self.send(py, &Message::Query(q))
    }

    /// A Query, waited for: `Proof` or `Miss`.
    fn query(
        &self,
        py: Python<'_>,
        token: Vec<u8>,
        epoch: u64,
        origin: u64,
        end: u64,
        groups: Vec<(u32, Vec<Vec<u8>>)>,
    ) -> PyResult<Py<PyAny>> {
        let id = self.submit_query(py, token, epoch, origin, end, groups)?;
        match self.wait_message(py, id, None)? {
            m @ (Message::Proof(_) | Message::Miss { .. }) => to_python(py, m),
            other => Err(unexpected(py, &other, "Proof or Miss")),
        }
    }

    /// Sends an Acquire (a Query that pins what it proves under a lease); its reply is
    /// `Leased` or `Miss`.
    fn submit_acquire(
        &self,
        py: Python<'_>,
        token: Vec<u8>,
        epoch: u64,
        origin: u64,
        end: u64,
        groups: Vec<(u32, Vec<Vec<u8>>)>,
    ) -> PyResult<u64> {
        let q = query_request(py, &token, epoch, origin, end, groups)?;
        self.send(py, &Message::Acquire(q))
    }

    /// An Acquire, waited for: `Leased` or `Miss`.
    fn acquire(
        &self,
        py: Python<'_>,
        token: Vec<u8>,
        epoch: u64,
        origin: u64,
        end: u64,
        groups: Vec<(u32, Vec<Vec<u8>>)>,
    ) -> PyResult<Py<PyAny>> {
        let id = self.submit_acquire(py, token, epoch, origin, end, groups)?;
        match self.wait_message(py, id, None)? {
            m @ (Message::Leased { .. } | Message::Miss { .. }) => to_python(py, m),
            other => Err(unexpected(py, &other, "Leased or Miss")),
        }
    }

    /// Sends a Load of leased records into pages: `pages` is one `(block, group, rank, pool,
    /// index, generation, layer_start, layer_end)` per page. Its reply is `Pages("loaded")`.
    fn submit_load(
        &self,
        py: Python<'_>,
        token: Vec<u8>,
        epoch: u64,
        lease: u64,
        pages: Vec<LoadTuple>,
    ) -> PyResult<u64> {
        let req = LoadRequest {
            token: self::token(py, &token)?,
            epoch,
            lease,
            pages: pages
                .into_iter()
                .map(
                    |(block, group, rank, pool, index, generation, layer_start, layer_end)| {
                        LoadPage {
                            block,
                            group,
                            rank,
                            page: PageRef {
                                pool: PoolId(pool),
                                index,
                                generation,
                            },
                            layer_start,
                            layer_end,
                        }
                    },
                )
                .collect(),
        };
        self.send(py, &Message::Load(req))
    }

    /// A Load, waited for: each page's status.
    fn load(
        &self,
        py: Python<'_>,
        token: Vec<u8>,
        epoch: u64,
        lease: u64,
        pages: Vec<LoadTuple>,
    ) -> PyResult<Vec<&'static str>> {
        let id = self.submit_load(py, token, epoch, lease, pages)?;
        match self.wait_message(py, id, None)? {
            Message::Loaded { pages } => Ok(pages.iter().map(|p| p.name()).collect()),
            other => Err(unexpected(py, &other, "Loaded")),
        }
    }

    /// Sends a Publish of pages: `pages` is one `(group, rank, hash, parent, start, end, pool,
    /// index, generation)` per page (`parent` empty for the first block). Two replies come:
    /// `Pages("copied")` once the pages may be reused, then `Pages("durable")`.
    fn submit_publish(
        &self,
        py: Python<'_>,
        token: Vec<u8>,
        epoch: u64,
        pages: Vec<PublishTuple>,
    ) -> PyResult<u64> {
        let req = PublishRequest {
            token: self::token(py, &token)?,
            epoch,
            pages: pages
                .into_iter()
                .map(
                    |(group, rank, hash, parent, start, end, pool, index, generation)| {
                        PublishPage {
                            group,
                            rank,
                            hash,
                            parent,
                            start,
                            end,
                            page: PageRef {
                                pool: PoolId(pool),
                                index,
                                generation,
                            },
                        }
                    },
                )
                .collect(),
        };
        self.send(py, &Message::Publish(req))
    }

    /// A Publish, waited for until durable: returns `(copied, durable)`, the two replies.
    fn publish(
        &self,
        py: Python<'_>,
        token: Vec<u8>,
        epoch: u64,
        pages: Vec<PublishTuple>,
    ) -> PyResult<(Py<PyAny>, Py<PyAny>)> {
        let id = self.submit_publish(py, token, epoch, pages)?;
        let copied = match self.wait_message(py, id, None)? {
            m @ Message::PublishCopied { .. } => to_python(py, m)?,
            other => return Err(unexpected(py, &other, "PublishCopied")),
        };
        let durable = match self.wait_message(py, id, None)? {
            m @ Message::PublishDurable { .. } => to_python(py, m)?,
            other => return Err(unexpected(py, &other, "PublishDurable")),
        };
        Ok((copied, durable))
    }

    /// Sends a Release of `lease`; its reply is `Done("released")`.
    fn submit_release(&self, py: Python<'_>, token: Vec<u8>, lease: u64) -> PyResult<u64> {
        let m = Message::Release {
            token: self::token(py, &token)?,
            lease,
        };
        self.send(py, &m)
    }

    /// Ends a lease, waited for.
    fn release(&self, py: Python<'_>, token: Vec<u8>, lease: u64) -> PyResult<()> {
        let id = self.submit_release(py, token, lease)?;
        match self.wait_message(py, id, None)? {
            Message::Released => Ok(()),
            other => Err(unexpected(py, &other, "Released")),
        }
    }

    /// Makes every accepted Publish durable.
    fn sync(&self, py: Python<'_>) -> PyResult<()> {
        let id = self.send(py, &Message::Sync)?;
        match self.wait_message(py, id, None)? {
            Message::Synced => Ok(()),
            other => Err(unexpected(py, &other, "Synced")),
        }
    }

    /// The daemon's metrics, as text.
    fn stats(&self, py: Python<'_>) -> PyResult<String> {
        let id = self.send(py, &Message::Stats)?;
        match self.wait_message(py, id, None)? {
            Message::StatsReply { text } => Ok(text),
            other => Err(unexpected(py, &other, "StatsReply")),
        }
    }

    fn __repr__(&self) -> String {
        format!("Connection({:?}, server={:?})", self.socket, self.server)
    }
}

impl Connection {
    fn pool_registered(&self, py: Python<'_>, id: u64) -> PyResult<u32> {
        match self.wait_message(py, id, None)? {
            Message::PoolRegistered { pool } => Ok(pool.0),
            other => Err(unexpected(py, &other, "PoolRegistered")),
        }
    }
}

impl Connection {
    /// Shuts the socket down and stops the drainer (without waiting for it).
    fn shut(&self) {
        {
            let s = self.sender.lock().unwrap_or_else(|e| e.into_inner());
            let _ = s.stream.shutdown(std::net::Shutdown::Both);
        }
        self.shared.inbox().stopping = true;
        self.shared.tick.notify_all();
        self.shared.arrived.notify_all();
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.shut();
    }
}

/// The paths `Connection(socket)` tries, in order (`socket`, else `ORBITKV_SOCKET`, else the
/// local and system defaults).
#[pyfunction]
#[pyo3(signature = (socket = None))]
pub fn socket_candidates(socket: Option<PathBuf>) -> Vec<String> {
    discover::socket_candidates(socket.as_deref(), std::env::var_os(discover::SOCKET_VAR))
        .iter()
        .map(|p| Path::display(p).to_string())
        .collect()
}

/// A rank's seal: its session id, the instance's epoch and namespace, and the token every
/// hot-path request carries.
#[pyclass(frozen, module = "orbitkv._native")]
pub struct Sealed {
    session: u64,
    epoch: u64,
    namespace: [u8; 32],
    token: Token,
}

#[pymethods]
impl Sealed {
    /// This rank's session id.
    #[getter]
    fn session(&self) -> u64 {
        self.session
    }

    /// The instance's epoch.
    #[getter]
    fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The instance's namespace (32 bytes).
    #[getter]
    fn namespace<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.namespace)
    }

    /// The session token every hot-path request carries (32 bytes).
    #[getter]
    fn token<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.token)
    }

    fn __repr__(&self) -> String {
        format!("Sealed(session={}, epoch={})", self.session, self.epoch)
    }
}

/// A pool registered.
#[pyclass(frozen, module = "orbitkv._native", get_all)]
pub struct PoolRegistered {
    /// The pool's id.
    pub pool: u32,
}

/// The records to load for one group and rank: block indices into the query's hash list.
#[pyclass(frozen, module = "orbitkv._native", get_all)]
#[derive(Clone)]
pub struct ProofLoad {
    /// The cache group.
    pub group: u32,
    /// The rank (`0xFFFFFFFF`: replicated).
    pub rank: u32,
    /// Block indices, in token order.
    pub blocks: Vec<u32>,
}

/// A proven restorable boundary and what to load for it.
#[pyclass(frozen, module = "orbitkv._native", get_all)]
#[derive(Clone)]
pub struct Proof {
    /// Tokens up to here can be restored.
    pub boundary: u64,
    /// What to load, per group and rank.
    pub loads: Vec<ProofLoad>,
}

impl From<WireProof> for Proof {
    fn from(p: WireProof) -> Self {
        Self {
            boundary: p.boundary,
            loads: p
                .loads
                .into_iter()
                .map(|l| ProofLoad {
                    group: l.group,
                    rank: l.rank,
                    blocks: l.blocks,
                })
                .collect(),
        }
    }
}

#[pymethods]
impl Proof {
    fn __repr__(&self) -> String {
        format!(
            "Proof(boundary={}, loads={})",
            self.boundary,
            self.loads.len()
        )
    }
}

/// Nothing beyond the origin can be restored, and why (docs/protocol.md, "Miss reasons").
#[pyclass(frozen, module = "orbitkv._native", get_all)]
pub struct Miss {
    /// The reason's code.
    pub reason: u16,
    /// The reason's name.
    pub reason_name: Option<&'static str>,
    /// A readable account.
    pub detail: String,
}

impl Miss {
    fn new(reason: u16, detail: String) -> Self {
        Self {
            reason,
            reason_name: orbitkv_protocol::miss::miss_reason_name(reason),
            detail,
        }
    }
}

#[pymethods]
impl Miss {
    fn __repr__(&self) -> String {
        format!("Miss({:?}, {:?})", self.reason_name, self.detail)
    }
}

/// The proven records are pinned under a lease.
#[pyclass(frozen, module = "orbitkv._native", get_all)]
pub struct Leased {
    /// The lease.
    pub lease: u64,
    /// It ends this long after its last use unless released.
    pub ttl_ms: u32,
    /// What was proven and pinned.
    pub proof: Proof,
}

#[pymethods]
impl Leased {
    fn __repr__(&self) -> String {
        format!(
            "Leased(lease={}, boundary={})",
            self.lease, self.proof.boundary
        )
    }
}

/// Per-page statuses of a Load (`kind` "loaded"), or of a Publish once copied ("copied") or
/// durable ("durable", with `retry_after` seconds for pages to send again later).
#[pyclass(frozen, module = "orbitkv._native", get_all)]
pub struct Pages {
    /// "loaded", "copied" or "durable".
    pub kind: &'static str,
    /// Each page's status, in request order (`ok`, `stale_generation`, ...).
    pub statuses: Vec<&'static str>,
    /// Seconds to wait before publishing `retry_later` pages again.
    pub retry_after: f64,
}

impl Pages {
    fn new(kind: &'static str, pages: &[PageStatus], retry_after_ms: u32) -> Self {
        Self {
            kind,
            statuses: pages.iter().map(|p| p.name()).collect(),
            retry_after: f64::from(retry_after_ms) / 1000.0,
        }
    }
}

#[pymethods]
impl Pages {
    /// Whether every page is `ok`.
    #[getter]
    fn all_ok(&self) -> bool {
        self.statuses.iter().all(|s| *s == "ok")
    }

    fn __repr__(&self) -> String {
        format!("Pages({:?}, {:?})", self.kind, self.statuses)
    }
}

/// A request done: "released" or "synced".
#[pyclass(frozen, module = "orbitkv._native", get_all)]
pub struct Done {
    /// What was done.
    pub kind: &'static str,
}

impl Done {
    fn new(kind: &'static str) -> Self {
        Self { kind }
    }
}
