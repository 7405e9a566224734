//! The control plane: a Unix-socket server. Each connection is served by its own thread reading
//! length-framed messages ([`crate::protocol`]); replies go back on the same connection, and a
//! seal's replies to every rank of the instance. A frame that does not decode is answered with
//! an `Error` and the connection closed; the daemon and its other clients carry on.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use orbitkv_gpu_bridge::fdpass::recv_with_fd;
use orbitkv_state::{RankSpec, StorageLayout};
use orbitkv_store::StateStore;
use orbitkv_wal::NamespaceInfo;

use crate::metrics::{Metrics, Timed, inc};
use crate::peer::{PeerPolicy, peer_cred};
use crate::protocol::frame::ReadError;
use crate::protocol::{DEFAULT_MAX_BODY, ErrorCode, Message, read_frame};
use crate::session::{ConnId, Event, OsRandom, Refusal, Sessions};

/// Longest socket path `sun_path` holds (108 bytes with the terminating NUL).
pub const MAX_SOCKET_PATH: usize = 107;

/// How the server runs.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// The socket's path.
    pub socket: PathBuf,
    /// Largest message body accepted.
    pub max_body: u32,
    /// Who may connect besides the daemon's own user and root.
    pub peers: PeerPolicy,
    /// Once a frame's first byte is in, the rest must arrive within this (a client may idle
    /// between frames as long as it likes).
    pub frame_timeout: Duration,
    /// A lease not used for this long ends (its pins are given back).
    pub lease_ttl: Duration,
    /// Leases one connection may hold at once.
    pub max_leases_per_client: usize,
    /// Store pins one connection's leases may hold at once.
    pub max_pins_per_client: usize,
    /// Page bytes one Load or Publish may move (a client's bytes in flight: the daemon serves
    /// one request per connection at a time).
    pub max_request_bytes: u64,
}

impl ServerConfig {
    /// Defaults for a socket at `socket`.
    pub fn new(socket: impl Into<PathBuf>) -> Self {
        Self {
            socket: socket.into(),
            max_body: DEFAULT_MAX_BODY,
            peers: PeerPolicy::default(),
            frame_timeout: Duration::from_secs(10),
            lease_ttl: Duration::from_secs(30),
            max_leases_per_client: 4096,
            max_pins_per_client: 1 << 20,
            max_request_bytes: 1 << 30,
        }
    }
}

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The socket path does not fit `sun_path`.
    #[error(
        "socket path {path} is {len} bytes; Unix sockets take at most {MAX_SOCKET_PATH} (choose a shorter --socket)"
    )]
    SocketPathTooLong {
        /// The path.
        path: PathBuf,
        /// Its length.
        len: usize,
    },
    /// Another daemon answers on the socket.
    #[error("another daemon is already serving on {0}")]
    AlreadyServing(PathBuf),
    /// An operating-system call failed.
    #[error("{what} {path}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// On what.
        path: PathBuf,
        /// The error.
        #[source]
        source: io::Error,
    },
}

/// One client connection's sending side.
struct Conn {
    out: Mutex<UnixStream>,
}

impl Conn {
    fn send(&self, request: u64, m: &Message) {
        let Ok(frame) = m.encode_frame(request) else {
            return;
        };
        let mut s = self.out.lock().unwrap_or_else(|e| e.into_inner());
        // A client that went away is cleaned up by its reading thread.
        let _ = s.write_all(&frame);
    }
}

struct Shared {
    config: ServerConfig,
    store: Arc<StateStore>,
    sessions: Mutex<Sessions>,
    leases: Mutex<crate::lease::Leases>,
    /// Each worker connection's registered pools.
    bridges: Mutex<HashMap<ConnId, Arc<orbitkv_gpu_bridge::Bridge>>>,
    /// Held shared by every Load from its lease check until its last page is copied, and
    /// exclusively by a retirement until it has ended the namespace's leases: once a Retired
    /// reply is sent, no Load is still copying a record the retirement covers.
    retire_gate: RwLock<()>,
    conns: Mutex<HashMap<ConnId, (Arc<Conn>, u64)>>,
    next_conn: AtomicU64,
    stop: AtomicBool,
    metrics: Metrics,
}

impl Shared {
    fn sessions(&self) -> MutexGuard<'_, Sessions> {
        self.sessions.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Refuses a Load or Publish whose pages hold more than the per-request byte limit.
    fn check_request_bytes(
        &self,
        what: &str,
        bridge: &orbitkv_gpu_bridge::Bridge,
        pages: impl Iterator<Item = (orbitkv_gpu_bridge::PageRef, u32, std::ops::Range<u32>)>,
    ) -> Result<(), Refusal> {
        let bytes = crate::transfer::request_bytes(bridge, pages);
        if bytes > self.config.max_request_bytes {
            return Err(Refusal::new(
                ErrorCode::LimitExceeded,
                format!(
                    "a {what} of {bytes} page bytes passes the limit of {} per request; split it",
                    self.config.max_request_bytes
                ),
            ));
        }
        Ok(())
    }

    /// The pools of connection `id` (made on first use).
    fn bridge(&self, id: ConnId) -> Arc<orbitkv_gpu_bridge::Bridge> {
        self.bridges
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(id)
            .or_default()
            .clone()
    }

    fn leases(&self) -> MutexGuard<'_, crate::lease::Leases> {
        self.leases.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The session of a hot-path request, counting refusals.
    fn session(
        &self,
        token: &crate::protocol::message::Token,
        epoch: Option<u64>,
    ) -> Result<crate::session::Session, Refusal> {
        let s = self.sessions();
        let r = match epoch {
            Some(e) => s.check(token, e),
            None => s.check_token(token),
        };
        r.cloned()
            .inspect_err(|_| inc(&self.metrics.refused_tokens))
    }

    /// Sends what a registration or a timeout produced; a seal registers the namespace first.
    fn dispatch(&self, events: Vec<Event>) {
        // Every rank of a seal shares its namespace: registered once, the outcome for all.
        let mut registered: HashMap<[u8; 32], Result<(), Refusal>> = HashMap::new();
        for e in events {
            let (conn, reply) = match e {
                Event::Sealed { conn, reply } => {
                    let (ns, token) = match &reply {
                        Message::Sealed {
                            namespace, token, ..
                        } => (*namespace, *token),
                        _ => ([0; 32], [0; 32]),
                    };
                    let outcome = registered
                        .entry(ns)
                        .or_insert_with(|| self.on_sealed(&token));
                    if let Err(refusal) = outcome {
                        (conn, refusal.message())
                    } else {
                        inc(&self.metrics.seals);
                        (conn, reply)
                    }
                }
                Event::Refused { conn, refusal } => {
                    inc(&self.metrics.seal_refusals);
                    (conn, refusal.message())
                }
            };
            let target = self
                .conns
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(&conn)
                .cloned();
            if let Some((c, request)) = target {
                c.send(request, &reply);
            }
        }
    }

    /// An instance sealed a new epoch: the leases of its earlier epochs end (their pins given
    /// back), and its namespace is registered in the store (durably, idempotently).
    fn on_sealed(&self, token: &crate::protocol::message::Token) -> Result<(), Refusal> {
        // By the seal's token: a connection that registered again holds several sessions.
        let inst = self
            .sessions()
            .check_token(token)
            .map(|x| x.instance.clone());
        let Ok(inst) = inst else {
            return Ok(());
        };
        let ended =
            self.leases()
                .end_epochs_before(&self.store, &inst.name, inst.epoch, Instant::now());
        if ended > 0 {
            tracing::info!(
                instance = inst.name,
                epoch = inst.epoch,
                leases = ended,
                "instance sealed a new epoch: the leases of its earlier epochs ended"
            );
        }
        let info = namespace_info(&inst.layout, &inst);
        self.store
            .register_namespace(inst.namespace, info)
            .map_err(|e| store_refusal(&e, "the store could not register the namespace"))
    }
}

/// The readable summary the store keeps for a namespace.
fn namespace_info(layout: &StorageLayout, inst: &crate::session::SealedInstance) -> NamespaceInfo {
    let format = layout.groups().first().and_then(|g| {
        g.formats
            .iter()
            .find(|f| f.rank != RankSpec::Replicated)
            .or(g.formats.first())
    });
    NamespaceInfo {
        identity: *inst.identity.digest(),
        layout_digest: layout.digest(),
        model: inst.model.clone(),
        revision: inst.revision.clone(),
        engine: format
            .map(|f| f.compat.engine.to_string())
            .unwrap_or_default(),
        engine_release: format
            .map(|f| f.compat.release.as_str().to_owned())
            .unwrap_or_default(),
        dtype: format
            .map(|f| f.dtype.as_str().to_owned())
            .unwrap_or_default(),
        parallel: layout.parallel(),
    }
}

/// Stops a running server from another thread (a signal handler's flag, a test).
#[derive(Clone)]
pub struct Stopper(Arc<Shared>);

impl Stopper {
    /// Asks the server to stop: it stops accepting, closes every connection and returns.
    pub fn stop(&self) {
        self.0.stop.store(true, Ordering::Release);
    }
}

/// The control-plane server.
pub struct Server {
    listener: UnixListener,
    shared: Arc<Shared>,
}

impl Server {
    /// Binds the socket (mode 0660; a stale socket file nobody answers on is replaced).
    pub fn bind(config: ServerConfig, store: Arc<StateStore>) -> Result<Self, ServeError> {
        let path = config.socket.clone();
        let len = path.as_os_str().len();
        if len > MAX_SOCKET_PATH {
            return Err(ServeError::SocketPathTooLong { path, len });
        }
        let io_err = |what, source| ServeError::Io {
            what,
            path: path.clone(),
            source,
        };
        if let Ok(meta) = std::fs::symlink_metadata(&path) {
            use std::os::unix::fs::FileTypeExt;
            if !meta.file_type().is_socket() {
                return Err(io_err(
                    "refusing to replace",
                    io::Error::new(io::ErrorKind::AlreadyExists, "not a socket"),
                ));
            }
            if UnixStream::connect(&path).is_ok() {
                return Err(ServeError::AlreadyServing(path));
            }
            std::fs::remove_file(&path).map_err(|e| io_err("removing the stale socket", e))?;
        }
        let listener = UnixListener::bind(&path).map_err(|e| io_err("binding", e))?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o660))
            .map_err(|e| io_err("setting the mode of", e))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| io_err("configuring", e))?;
        let leases =
            crate::lease::Leases::new(config.max_leases_per_client, config.max_pins_per_client);
        Ok(Self {
            listener,
            shared: Arc::new(Shared {
                leases: Mutex::new(leases),
                bridges: Mutex::new(HashMap::new()),
                retire_gate: RwLock::new(()),
                config,
                store,
                sessions: Mutex::new(Sessions::new(Box::new(OsRandom))),
                conns: Mutex::new(HashMap::new()),
                next_conn: AtomicU64::new(1),
                stop: AtomicBool::new(false),
                metrics: Metrics::default(),
            }),
        })
    }

    /// The socket's path.
    pub fn socket(&self) -> &Path {
        &self.shared.config.socket
    }

    /// A handle that stops the server.
    pub fn stopper(&self) -> Stopper {
        Stopper(self.shared.clone())
    }

    /// The metrics text now.
    pub fn metrics_text(&self) -> String {
        render(&self.shared)
    }

    /// A function rendering the metrics, for an exporter thread.
    pub fn metrics_source(&self) -> impl Fn() -> String + Send + Sync + 'static {
        let shared = self.shared.clone();
        move || render(&shared)
    }

    /// Serves until stopped: accepts connections, runs the seal timer; on stop closes every
    /// connection, waits for their threads, and removes the socket file.
    pub fn run(self) -> io::Result<()> {
        let shared = self.shared.clone();
        let timer = {
            let shared = shared.clone();
            std::thread::spawn(move || {
                while !shared.stop.load(Ordering::Acquire) {
                    std::thread::sleep(Duration::from_millis(10));
                    let events = shared.sessions().expire(Instant::now());
                    shared.dispatch(events);
                    shared.leases().expire(&shared.store, Instant::now());
                }
            })
        };
        let mut threads: Vec<JoinHandle<()>> = Vec::new();
        while !shared.stop.load(Ordering::Acquire) {
            match self.listener.accept() {
                Ok((stream, _)) => {
                    let shared = shared.clone();
                    threads.push(std::thread::spawn(move || serve_conn(&shared, stream)));
                    threads.retain(|t| !t.is_finished());
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    tracing::error!("accept failed: {e}");
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        }
        // Stop: close every connection (their threads see the end and clean up).
        for (c, _) in shared
            .conns
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
        {
            let s = c.out.lock().unwrap_or_else(|e| e.into_inner());
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
        for t in threads {
            let _ = t.join();
        }
        let _ = timer.join();
        let _ = std::fs::remove_file(&shared.config.socket);
        Ok(())
    }
}

fn render(shared: &Shared) -> String {
    let now = crate::metrics::Gauges {
        sessions: shared.sessions().session_count() as u64,
        leases: shared.leases().len() as u64,
        usage: shared.store.usage(),
    };
    shared.metrics.render(&now, &shared.store.stats())
}

/// Reads frames off a socket with `recvmsg`, keeping any descriptor that arrives with them.
struct FdReader {
    stream: UnixStream,
    fds: Vec<OwnedFd>,
}

impl Read for FdReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let (n, fd) = recv_with_fd(&self.stream, buf)?;
        if let Some(fd) = fd {
            self.fds.push(fd);
        }
        Ok(n)
    }
}

fn serve_conn(shared: &Arc<Shared>, stream: UnixStream) {
    let id = shared.next_conn.fetch_add(1, Ordering::Relaxed);
    inc(&shared.metrics.connections);
    let timeout = shared.config.frame_timeout.max(Duration::from_millis(1));
    let (Ok(out), Ok(cred), Ok(())) = (
        stream.try_clone(),
        peer_cred(&stream),
        stream.set_read_timeout(Some(timeout)),
    ) else {
        return;
    };
    let conn = Arc::new(Conn {
        out: Mutex::new(out),
    });
    if !shared.config.peers.allows(&cred) {
        inc(&shared.metrics.refused_peers);
        tracing::warn!(
            uid = cred.uid,
            pid = cred.pid,
            "peer refused by credentials"
        );
        conn.send(
            0,
            &Refusal::new(
                ErrorCode::NotPermitted,
                format!("user {} may not use this daemon", cred.uid),
            )
            .message(),
        );
        return;
    }
    shared
        .conns
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(id, (conn.clone(), 0));
    if shared.stop.load(Ordering::Acquire) {
        // Accepted while stopping: the stop may already have closed the others.
        shared
            .conns
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&id);
        return;
    }
    let mut reader = FdReader {
        stream,
        fds: Vec::new(),
    };
    let mut spare = crate::transfer::Spare::default();
    loop {
        let (header, body) = match read_timed_frame(&mut reader, &shared.config, &shared.stop) {
            Ok(f) => f,
            Err(ReadError::Io(e)) => {
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) {
                    inc(&shared.metrics.malformed);
                    conn.send(
                        0,
                        &malformed(format!(
                            "frame incomplete after {} ms",
                            shared.config.frame_timeout.as_millis()
                        )),
                    );
                }
                break;
            }
            Err(ReadError::Protocol(e)) => {
                inc(&shared.metrics.malformed);
                conn.send(0, &malformed(e.to_string()));
                break;
            }
        };
        let msg = match Message::decode(header.kind, &body) {
            Ok(m) => m,
            Err(e) => {
                inc(&shared.metrics.malformed);
                conn.send(header.request, &malformed(e.to_string()));
                break;
            }
        };
        let fds = std::mem::take(&mut reader.fds);
        if !handle(shared, id, &conn, header.request, msg, fds, &mut spare) {
            break;
        }
    }
    shared.sessions().disconnect(id);
    let bridge = shared
        .bridges
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .remove(&id);
    if let Some(b) = bridge {
        // No copy touches the client's pages from here on.
        b.detach_all();
    }
    let ended = shared.leases().drop_conn(&shared.store, id);
    if ended > 0 {
        tracing::info!(
            conn = id,
            leases = ended,
            "connection closed: its leases ended"
        );
    }
    shared
        .conns
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .remove(&id);
}

/// Reads a frame: waits as long as it takes for its first byte, then at most the frame timeout
/// for the rest. The socket's read timeout is the frame timeout (set once per connection);
/// a read that times out before the frame's first byte simply waits again, so only a frame begun
/// and not finished times out. The header is read in one call where it has arrived whole (the
/// usual case: one read for the header, one for the body).
fn read_timed_frame(
    reader: &mut FdReader,
    config: &ServerConfig,
    stop: &AtomicBool,
) -> Result<(crate::protocol::FrameHeader, Vec<u8>), ReadError> {
    let mut header = [0u8; crate::protocol::HEADER_LEN];
    let mut got = 0;
    while got < header.len() {
        match reader.read(&mut header[got..]) {
            Ok(0) => return Err(ReadError::Io(io::ErrorKind::UnexpectedEof.into())),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e)
                if got == 0
                    && matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
            {
                if stop.load(Ordering::Acquire) {
                    return Err(ReadError::Io(io::ErrorKind::UnexpectedEof.into()));
                }
            }
            Err(e) => return Err(ReadError::Io(e)),
        }
    }
    let mut chained = (&header[..]).chain(&mut *reader);
    read_frame(&mut chained, config.max_body)
}

fn malformed(detail: String) -> Message {
    Refusal::new(ErrorCode::Malformed, detail).message()
}

/// Handles one request; `false` closes the connection.
fn handle(
    shared: &Arc<Shared>,
    id: ConnId,
    conn: &Conn,
    request: u64,
    msg: Message,
    mut fds: Vec<OwnedFd>,
    spare: &mut crate::transfer::Spare,
) -> bool {
    let started = Instant::now();
    // Which latency histogram the reply is timed into.
    let timed = match &msg {
        Message::Query(_) => Some(Timed::Query),
        Message::Acquire(_) => Some(Timed::Acquire),
        Message::Load(_) => Some(Timed::Load),
        Message::Publish(_) => Some(Timed::PublishDurable),
        Message::Release { .. } => Some(Timed::Release),
        _ => None,
    };
    let reply = match msg {
        Message::Hello { .. } => Message::Welcome {
            server: format!("orbitkv {}", env!("CARGO_PKG_VERSION")),
            max_body: shared.config.max_body,
        },
        Message::Register(reg) => {
            // Replies come when the round seals, times out or is refused.
            if let Some(entry) = shared
                .conns
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get_mut(&id)
            {
                entry.1 = request;
            }
            let events = shared.sessions().register(id, reg, Instant::now());
            shared.dispatch(events);
            return true;
        }
        Message::Stats => Message::StatsReply {
            text: render(shared),
        },
        Message::Sync => match shared.store.sync() {
            Ok(()) => Message::Synced,
            Err(e) => store_refusal(&e, "sync").message(),
        },
        Message::Retire { namespace } => match retire(shared, namespace) {
            Ok(watermark) => Message::Retired { watermark },
            Err(r) => r.message(),
        },
        Message::Query(q) => match query(shared, &q, false) {
            Ok(m) => m,
            Err(r) => r.message(),
        },
        Message::Acquire(q) => match query(shared, &q, true) {
            Ok(m) => m,
            Err(r) => r.message(),
        },
        Message::Release { token, lease } => {
            let r = shared
                .session(&token, None)
                .and_then(|s| shared.leases().release(&shared.store, lease, &s));
            match r {
                Ok(()) => Message::Released,
                Err(r) => r.message(),
            }
        }
        Message::RegisterPool {
            token,
            spec,
            memory,
        } => {
            let pool = spec.pool;
            let r = shared.session(&token, None).and_then(|s| {
                if s.role != crate::protocol::Role::Worker {
                    return Err(Refusal::new(
                        ErrorCode::Malformed,
                        "only a worker session registers page pools",
                    ));
                }
                let bridge = shared.bridge(id);
                crate::transfer::register_pool(&bridge, &s, spec, memory, fds.pop())
            });
            match r {
                Ok(()) => Message::PoolRegistered { pool },
                Err(r) => r.message(),
            }
        }
        Message::Load(l) => {
            let r = shared.session(&l.token, Some(l.epoch)).and_then(|s| {
                let bridge = shared.bridge(id);
                let pages = l
                    .pages
                    .iter()
                    .map(|p| (p.page, p.group, p.layer_start..p.layer_end));
                shared.check_request_bytes("Load", &bridge, pages)?;
                // No retirement completes while this Load copies (see `retire_gate`).
                let _gate = shared.retire_gate.read().unwrap_or_else(|e| e.into_inner());
                let pins = shared
                    .leases()
                    .get(l.lease, &s, Instant::now())?
                    .pins
                    .clone();
                Ok(crate::transfer::load(
                    &shared.store,
                    &bridge,
                    l.epoch,
                    &pins,
                    &l.pages,
                ))
            });
            match r {
                Ok((pages, moved)) => {
                    shared.metrics.pages(&pages, true);
                    shared
                        .metrics
                        .loaded_bytes
                        .fetch_add(moved, Ordering::Relaxed);
                    Message::Loaded { pages }
                }
                Err(r) => r.message(),
            }
        }
        Message::Publish(p) => {
            let r = shared.session(&p.token, Some(p.epoch)).and_then(|s| {
                let bridge = shared.bridge(id);
                let pages = p.pages.iter().map(|x| (x.page, x.group, 0..u32::MAX));
                shared.check_request_bytes("Publish", &bridge, pages)?;
                Ok(crate::transfer::copy_out(&bridge, &s, &p.pages, spare))
            });
            match r {
                Ok(copied) => {
                    shared
                        .metrics
                        .published_bytes
                        .fetch_add(copied.bytes(), Ordering::Relaxed);
                    // The pages may be reused now: nothing reads them again. Storing and
                    // durability are the second reply.
                    conn.send(
                        request,
                        &Message::PublishCopied {
                            pages: copied.statuses.clone(),
                        },
                    );
                    shared
                        .metrics
                        .observe(Timed::PublishCopied, started.elapsed());
                    let mut stored = crate::transfer::store_copies(&shared.store, copied, spare);
                    // A store that syncs every put has made them durable already.
                    if !stored.durable
                        && let Err(e) = shared.store.sync()
                    {
                        stored.sync_failed(&e);
                    }
                    shared.metrics.pages(&stored.statuses, false);
                    Message::PublishDurable {
                        pages: stored.statuses,
                        retry_after_ms: crate::session::millis(stored.retry_after),
                    }
                }
                Err(r) => r.message(),
            }
        }
        other => {
            inc(&shared.metrics.malformed);
            conn.send(
                request,
                &malformed(format!(
                    "message type {:#06x} is a reply, not a request",
                    other.kind()
                )),
            );
            return false;
        }
    };
    conn.send(request, &reply);
    if let Some(k) = timed {
        shared.metrics.observe(k, started.elapsed());
    }
    true
}

/// Query (no side effects) or Acquire (then pins under a lease).
fn query(
    shared: &Shared,
    q: &crate::protocol::message::QueryRequest,
    acquire: bool,
) -> Result<Message, Refusal> {
    let session = shared.session(&q.token, Some(q.epoch))?;
    inc(&shared.metrics.queries);
    let (answer, rejected) = crate::query::answer(&session.instance, &shared.store, q)?;
    for r in &rejected {
        shared.metrics.rejection(r);
    }
    match answer {
        crate::query::Answer::Miss { reason, detail } => {
            shared.metrics.miss(reason);
            Ok(Message::Miss { reason, detail })
        }
        crate::query::Answer::Hit { proof, records } => {
            inc(&shared.metrics.hits);
            shared
                .metrics
                .proven_tokens
                .fetch_add(proof.boundary.saturating_sub(q.origin), Ordering::Relaxed);
            if !acquire {
                return Ok(Message::Proof(proof));
            }
            let ttl = shared.config.lease_ttl;
            let lease =
                shared
                    .leases()
                    .acquire(&shared.store, &session, &records, ttl, Instant::now())?;
            Ok(Message::Leased {
                lease,
                ttl_ms: u32::try_from(ttl.as_millis()).unwrap_or(u32::MAX),
                proof,
            })
        }
    }
}

/// The refusal of a request the store failed: to be retried later (and when), refused for good,
/// or naming a namespace the store does not hold.
fn store_refusal(e: &orbitkv_store::Error, what: &str) -> Refusal {
    let detail = format!("{what}: {e}");
    match e.retry() {
        orbitkv_store::Retry::After(after) => Refusal::retry_later(after, detail),
        _ if matches!(e, orbitkv_store::Error::UnknownNamespace(_)) => {
            Refusal::new(ErrorCode::UnknownNamespace, detail)
        }
        orbitkv_store::Retry::Never | orbitkv_store::Retry::Rejected => {
            Refusal::new(ErrorCode::Refused, detail)
        }
    }
}

/// Retires `namespace`: once this returns, no record of it below the watermark reaches any
/// page — its leases have ended, pinned reads refuse it, and no Load that began before is still
/// copying.
fn retire(shared: &Shared, namespace: [u8; 32]) -> Result<u64, Refusal> {
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
        .map_err(|e| store_refusal(&e, "retire"))?;
    let ended = shared
        .leases()
        .end_namespace(&shared.store, ns, Instant::now());
    tracing::info!(namespace = %ns, watermark, leases = ended, "namespace retired");
    Ok(watermark)
}
