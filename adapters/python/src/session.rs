//! A connection to the daemon with many requests outstanding: each `submit_*` sends a request
//! and returns its id at once; `poll` takes a reply if one has come, `wait` blocks (without the
//! GIL) until one does. The typed calls (`query`, `publish`, ...) are a submit and a wait.
//!
//! Replies are read leader/follower: a waiting thread reads the socket itself when no other
//! thread is reading it, filing each reply under its request's id, so a round trip costs no
//! thread hop; others wait for the reader to file theirs. A drainer thread reads what has
//! arrived while nobody waits, so the daemon never finds the connection unread (it
//! disconnects a peer whose replies stay queued). The reading side is `inbox.rs`.

use std::io::{ErrorKind, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use pyo3::prelude::*;

use orbitkv_adapters::process::Process;
use orbitkv_gpu_bridge::fdpass::{peer_cred, send_with_fds};
use orbitkv_gpu_bridge::{PageMemory, PageRef, PoolId};
use orbitkv_protocol::message::{
    GroupHashes, LoadPage, LoadRequest, MAX_NAME, PublishPage, PublishRequest, QueryRequest,
    Register, Token,
};
use orbitkv_protocol::{DEFAULT_MAX_BODY, Message, Role, discover, read_frame};
use orbitkv_state::HashDomain;

use crate::errors::{DaemonNotFound, TimedOut, error, invalid, lost, refused, violation};
use crate::fd_unsafe::with_borrowed;
use crate::inbox::{Ended, READ_SLICE, Shared, Unanswered};
use crate::layout::rule;
use crate::pool::HostPool;
use crate::replies::to_python;

/// Why a closed connection's requests fail.
const CLOSED: &str = "the connection was closed (close())";

/// A wait that ended without a reply, as a Python exception.
fn unanswered(py: Python<'_>, request: u64, timeout: Option<f64>, why: Unanswered) -> PyErr {
    match why {
        Unanswered::TimedOut => error::<TimedOut>(
            py,
            "timed_out",
            true,
            0.0,
            format!(
                "no reply to request {request} within {} s",
                timeout.unwrap_or_default()
            ),
        ),
        Unanswered::NotDue => invalid(
            py,
            format!("no reply is due for request {request} (never sent, taken, or forgotten)"),
        ),
        Unanswered::Ended(Ended::Lost(why)) => lost(py, why),
        Unanswered::Ended(Ended::Violation(why)) => violation(py, why),
        Unanswered::Ended(Ended::Closed) => lost(py, CLOSED),
    }
}

/// A Load's page from Python: `(block, group, rank, pool, index, generation, layer_start,
/// layer_end)`.
type LoadTuple = (u32, u32, u32, u32, u32, u64, u32, u32);

/// A Publish's page from Python: `(group, rank, hash, parent, start, end, pool, index,
/// generation)`.
type PublishTuple = (u32, u32, Vec<u8>, Vec<u8>, u64, u64, u32, u32, u64);

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
/// answer the handshake within `handshake_timeout` seconds is `ConnectionLost`. A request the
/// daemon takes no byte of within `send_timeout` seconds (a daemon stopped with its socket
/// open) ends the connection: that submit, and every later one, is `ConnectionLost`.
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
    /// How long a write may take no byte before the connection is lost, in seconds.
    send_timeout: f64,
    /// The daemon's process, where its id is visible here.
    daemon: Option<Process>,
}

fn token(py: Python<'_>, t: &[u8]) -> PyResult<Token> {
    Token::try_from(t)
        .map_err(|_| invalid(py, format!("token: 32 bytes expected, got {}", t.len())))
}

impl Connection {
    /// Replies a request gets: a Publish two (PublishCopied, then PublishDurable), any other
    /// one. An Error is always the last.
    fn replies_due(m: &Message) -> u8 {
        match m {
            Message::Publish(_) => 2,
            _ => 1,
        }
    }

    fn send(&self, py: Python<'_>, m: &Message) -> PyResult<u64> {
        // All without the GIL: a daemon slow to read holds up only this thread, and no thread
        // ever holds the sender while it waits for the GIL (that would deadlock against one
        // holding the GIL while it waits for the sender).
        let shared = &*self.shared;
        let sent = py.detach(|| {
            let mut s = self.sender.lock().unwrap_or_else(|e| e.into_inner());
            let id = s.next;
            s.next += 1;
            let frame = m.encode_frame(id).map_err(|e| Unsent::Bad(e.to_string()))?;
            shared.inbox().expect(id, Self::replies_due(m));
            if let Err(e) = s.stream.write_all(&frame) {
                shared.inbox().unexpect(id);
                // Part of a frame may be on the wire: nothing more can be sent after it.
                shared.end(Ended::Lost(format!("sending: {e}")));
                return Err(Unsent::Io(e));
            }
            Ok(id)
        });
        sent.map_err(|e| match e {
            Unsent::Io(e) => lost(py, self.sending(&e)),
            Unsent::Bad(e) => invalid(py, format!("request: {e}")),
        })
    }

    /// Why a send failed: a write that took no byte within the send timeout says so.
    fn sending(&self, e: &std::io::Error) -> String {
        let socket = self.socket.display();
        match e.kind() {
            ErrorKind::WouldBlock | ErrorKind::TimedOut => format!(
                "sending to {socket}: the daemon took no byte within {} s (send_timeout)",
                self.send_timeout
            ),
            _ => format!("sending to {socket}: {e}"),
        }
    }

    /// Sends `m` with descriptors beside it. The GIL is held throughout, so that Python code
    /// cannot close the descriptors meanwhile ([`with_borrowed`]); the sender's other holders
    /// never wait for the GIL, so this cannot deadlock.
    fn send_with(&self, py: Python<'_>, m: &Message, fds: &[i32]) -> PyResult<u64> {
        let mut s = self.sender.lock().unwrap_or_else(|e| e.into_inner());
        let id = s.next;
        let frame = m
            .encode_frame(id)
            .map_err(|e| invalid(py, format!("request: {e}")))?;
        // Due before it is sent: its reply may be read by another thread at once.
        self.shared.inbox().expect(id, Self::replies_due(m));
        let sent = match fds {
            [a] => with_borrowed(py, *a, |a| send_with_fds(&s.stream, &frame, &[a])),
            [a, b] => with_borrowed(py, *a, |a| {
                with_borrowed(py, *b, |b| send_with_fds(&s.stream, &frame, &[a, b]))
            })
            .flatten(),
            _ => return Err(invalid(py, "one or two descriptors")),
        };
        if !matches!(sent, Some(Ok(()))) {
            self.shared.inbox().unexpect(id);
        }
        match sent {
            None => Err(invalid(py, format!("descriptors {fds:?}: not open"))),
            Some(Err(e)) => {
                // A message cut short leaves part of a frame on the wire.
                self.shared.end(Ended::Lost(format!("sending: {e}")));
                Err(lost(py, self.sending(&e)))
            }
            Some(Ok(())) => {
                s.next += 1;
                Ok(id)
            }
        }
    }

    /// The next reply to `request`, waiting at most `timeout` seconds, without the GIL. With a
    /// timeout, Python signals (Ctrl-C) end the wait within [`READ_SLICE`]. Without one it
    /// blocks in the read itself, the fastest wake on a reply, until the reply comes, the
    /// connection ends or another thread closes it.
    fn next_reply(&self, py: Python<'_>, request: u64, timeout: Option<f64>) -> PyResult<Message> {
        let Some(t) = timeout else {
            return py
                .detach(|| self.shared.wait(request, None))
                .map_err(|why| unanswered(py, request, timeout, why));
        };
        if !t.is_finite() || t < 0.0 {
            return Err(invalid(py, format!("timeout {t}: seconds, at least 0")));
        }
        // A timeout too large to add to the clock is no timeout.
        let deadline = Duration::try_from_secs_f64(t)
            .ok()
            .and_then(|d| Instant::now().checked_add(d));
        loop {
            let slice = Instant::now() + READ_SLICE;
            let until = deadline.map_or(slice, |d| d.min(slice));
            match py.detach(|| self.shared.wait(request, Some(until))) {
                Ok(m) => return Ok(m),
                Err(Unanswered::TimedOut) if deadline.is_none_or(|d| Instant::now() < d) => {
                    py.check_signals()?;
                }
                Err(why) => return Err(unanswered(py, request, timeout, why)),
            }
        }
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

/// A socket timeout of `t` seconds (finite, above 0): one too large for a Duration is none, and
/// one below the socket's microsecond is a microsecond (zero would mean none).
fn seconds(t: f64) -> Option<Duration> {
    Duration::try_from_secs_f64(t)
        .ok()
        .map(|d| d.max(Duration::from_micros(1)))
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
    #[pyo3(signature = (socket = None, *, client = "orbitkv-python", handshake_timeout = 10.0,
        send_timeout = 10.0))]
    fn new(
        py: Python<'_>,
        socket: Option<PathBuf>,
        client: &str,
        handshake_timeout: f64,
        send_timeout: f64,
    ) -> PyResult<Self> {
        for (name, t) in [
            ("handshake_timeout", handshake_timeout),
            ("send_timeout", send_timeout),
        ] {
            if !t.is_finite() || t <= 0.0 {
                return Err(invalid(py, format!("{name} {t}: seconds, above 0")));
            }
        }
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
        let limit = seconds(handshake_timeout);
        let welcome = py.detach(|| -> Result<Message, String> {
            stream.set_read_timeout(limit).map_err(|e| e.to_string())?;
            stream.write_all(&hello).map_err(|e| e.to_string())?;
            let (h, body) = read_frame(&mut stream, DEFAULT_MAX_BODY).map_err(|e| e.to_string())?;
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
        // A daemon that stops reading (stopped with its socket open) fills the socket's buffer:
        // a write that takes no byte within `send_timeout` then fails instead of blocking every
        // thread that submits. SO_SNDTIMEO covers the descriptor-passing sends too.
        stream
            .set_write_timeout(seconds(send_timeout))
            .map_err(|e| lost(py, format!("{}: {e}", path.display())))?;
        // Where its id is visible from here (not in another PID namespace).
        let daemon = peer_cred(&stream)
            .ok()
            .and_then(|c| u32::try_from(c.pid).ok())
            .filter(|&pid| pid > 0)
            .and_then(Process::new);
        let read_half = stream
            .try_clone()
            .map_err(|e| lost(py, format!("{}: {e}", path.display())))?;
        let shared = Arc::new(
            Shared::new(read_half, max_body)
                .map_err(|e| lost(py, format!("{}: {e}", path.display())))?,
        );
        let drainer = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("orbitkv-drainer".into())
                .spawn(move || shared.drainer())
                .map_err(|e| lost(py, format!("no drainer thread: {e}")))?
        };
        Ok(Self {
            sender: Mutex::new(Sender { stream, next: 2 }),
            shared,
            socket: path,
            server,
            drainer: Mutex::new(Some(drainer)),
            send_timeout,
            daemon,
        })
    }

    /// The daemon's process id; `None` where it is not visible from this process (another PID
    /// namespace).
    #[getter]
    fn daemon_pid(&self) -> Option<u32> {
        self.daemon.map(|d| d.pid)
    }

    /// What the daemon's process this connection reached is doing: `"running"`, `"stopped"`
    /// (a thread stopped by a signal or a debugger: a copy it is in the middle of may land when
    /// it resumes) or `"gone"` (exited, or its id names another process now); `None` where it
    /// cannot be told (another PID namespace, `/proc` hidden).
    fn daemon_state(&self) -> Option<&'static str> {
        self.daemon.map(|d| d.state().name())
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
        self.shared.inbox().closed.as_ref().map(|e| match e {
            Ended::Lost(why) | Ended::Violation(why) => why.clone(),
            Ended::Closed => CLOSED.to_owned(),
        })
    }

    /// Closes the connection (idempotent): outstanding waits end with `ConnectionLost`.
    fn close(&self, py: Python<'_>) {
        // The socket is shut down through the reading side: no lock a sender may hold.
        self.shared.end(Ended::Closed);
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
    /// arrived when no other thread is reading). A request with no reply due raises
    /// `InvalidInput`.
    fn poll(&self, py: Python<'_>, request: u64) -> PyResult<Option<Py<PyAny>>> {
        match py.detach(|| self.shared.poll(request)) {
            Ok(Some(m)) => to_python(py, m).map(Some),
            Ok(None) => Ok(None),
            Err(why) => Err(unanswered(py, request, None, why)),
        }
    }

    /// Drops `request`'s replies, those come and those to come.
    fn forget(&self, request: u64) {
        self.shared.inbox().forget(request);
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

    /// Registers `pool` (a host pool in its own memfd) under the worker session `token`. Each
    /// pool registration waits up to `timeout` seconds (None: until it comes) for its reply;
    /// past it, `TimedOut`, and the reply is forgotten.
    #[pyo3(signature = (token, pool, *, timeout = None))]
    fn register_pool(
        &self,
        py: Python<'_>,
        token: Vec<u8>,
        pool: &HostPool,
        timeout: Option<f64>,
    ) -> PyResult<u32> {
        let m = Message::RegisterPool {
            token: self::token(py, &token)?,
            spec: pool.inner.spec().clone(),
            memory: PageMemory::Host,
        };
        let fd = std::os::fd::AsRawFd::as_raw_fd(&pool.inner.fd());
        let id = self.send_with(py, &m, &[fd])?;
        self.pool_registered(py, id, timeout)
    }

    /// Registers a pool whose pages are memory the engine allocated itself: `states`, a
    /// `HostPool(spec, states_only=True)`, and `memory_fd`, a descriptor of that memory
    /// holding page 0 at `offset`.
    #[pyo3(signature = (token, states, memory_fd, offset, *, timeout = None))]
    fn register_engine_memory_pool(
        &self,
        py: Python<'_>,
        token: Vec<u8>,
        states: &HostPool,
        memory_fd: i32,
        offset: u64,
        timeout: Option<f64>,
    ) -> PyResult<u32> {
        let m = Message::RegisterPool {
            token: self::token(py, &token)?,
            spec: states.inner.spec().clone(),
            memory: PageMemory::Engine { offset },
        };
        let fd = std::os::fd::AsRawFd::as_raw_fd(&states.inner.fd());
        let id = self.send_with(py, &m, &[fd, memory_fd])?;
        self.pool_registered(py, id, timeout)
    }

    /// Registers a pool whose pages are CUDA device memory: `states`, a
    /// `HostPool(spec, states_only=True)`, and the allocation's 64-byte IPC handle
    /// (`cuIpcGetMemHandle`) on the device whose 16-byte `uuid` is given (else, `uuid` empty
    /// or zero, on `device`, the ordinal as the daemon numbers devices), page 0 at `offset` in
    /// it. A daemon without the CUDA backend, driver or device refuses it (`RefusedError`,
    /// code `Unsupported`), as it refuses memory that is not on that device.
    #[pyo3(signature = (token, states, device, ipc_handle, offset, uuid = Vec::new(), *,
        timeout = None))]
    #[expect(
        clippy::too_many_arguments,
        reason = "positional arguments of a Python method"
    )]
    fn register_device_pool(
        &self,
        py: Python<'_>,
        token: Vec<u8>,
        states: &HostPool,
        device: i32,
        ipc_handle: Vec<u8>,
        offset: u64,
        uuid: Vec<u8>,
        timeout: Option<f64>,
    ) -> PyResult<u32> {
        let ipc_handle: [u8; 64] = ipc_handle.try_into().map_err(|h: Vec<u8>| {
            invalid(py, format!("an IPC handle is 64 bytes, not {}", h.len()))
        })?;
        let uuid: [u8; 16] = match uuid.len() {
            0 => [0; 16],
            _ => uuid.try_into().map_err(|u: Vec<u8>| {
                invalid(py, format!("a device UUID is 16 bytes, not {}", u.len()))
            })?,
        };
        let m = Message::RegisterPool {
            token: self::token(py, &token)?,
            spec: states.inner.spec().clone(),
            memory: PageMemory::Device {
                device,
                uuid,
                ipc_handle,
                offset,
            },
        };
        let fd = std::os::fd::AsRawFd::as_raw_fd(&states.inner.fd());
        let id = self.send_with(py, &m, &[fd])?;
        self.pool_registered(py, id, timeout)
    }

    /// Ends pool `pool`'s registration. Returns once the daemon has let go of its memory (no
    /// copy touches it; a device pool's mapping is closed), so the engine may free it.
    fn unregister_pool(&self, py: Python<'_>, token: Vec<u8>, pool: u32) -> PyResult<()> {
        let m = Message::UnregisterPool {
            token: self::token(py, &token)?,
            pool: PoolId(pool),
        };
        let id = self.send(py, &m)?;
        match self.wait_message(py, id, None)? {
            Message::PoolUnregistered { .. } => Ok(()),
            other => Err(unexpected(py, &other, "PoolUnregistered")),
        }
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
            other => {
                self.shared.inbox().forget(id);
                return Err(unexpected(py, &other, "PublishCopied"));
            }
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
    fn pool_registered(&self, py: Python<'_>, id: u64, timeout: Option<f64>) -> PyResult<u32> {
        match self.wait_message(py, id, timeout) {
            Ok(Message::PoolRegistered { pool }) => Ok(pool.0),
            Ok(other) => Err(unexpected(py, &other, "PoolRegistered")),
            Err(e) => {
                // Past its wait the reply is not wanted: the connection keeps none for it.
                if e.is_instance_of::<TimedOut>(py) {
                    self.shared.inbox().forget(id);
                }
                Err(e)
            }
        }
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.shared.end(Ended::Closed);
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
