//! The control plane: a Unix-socket server. [`Server::run`] accepts connections (up to the
//! configured limit) and stops the daemon; `conn` serves one connection — its read loop, each
//! frame with a deadline, and its replies through a bounded outbound queue drained by its own
//! writer; `handlers` answers each request; `committer` encodes and appends every Publish
//! waiting, from every publisher, makes them durable with one sync, and sends each
//! PublishDurable. A frame that does
//! not decode is answered with an `Error` and the connection closed; the daemon and its other
//! clients carry on.

mod committer;
mod conn;
mod handlers;

use std::collections::HashMap;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use orbitkv_protocol::{DEFAULT_MAX_BODY, ErrorCode, Message};
use orbitkv_state::{RankSpec, StorageLayout};
use orbitkv_store::StateStore;
use orbitkv_wal::NamespaceInfo;

use crate::metrics::{Metrics, inc};
use crate::peer::PeerPolicy;
use crate::session::{ConnId, Event, OsRandom, Refusal, Sessions};

use self::committer::Committer;
use self::conn::Conn;

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
    /// Page bytes one Load or Publish may move.
    pub max_request_bytes: u64,
    /// Connections served at once; one more is refused (`LimitExceeded`) and closed.
    pub max_connections: usize,
    /// Memory one connection may hold: its frame being read, its Publish copies waiting to be
    /// stored and its spare copy buffers. A frame that would pass it is refused
    /// (`LimitExceeded`), a Publish `RetryLater`. At least `max_request_bytes` plus `max_body`.
    /// Its replies waiting to be sent are bounded apart, by `max_body`.
    pub max_connection_bytes: u64,
    /// A reply not taken by the peer within this is its last: the connection is closed.
    pub send_timeout: Duration,
    /// Publish copies the daemon holds until they are stored, over every connection (each
    /// connection's also count in its own `max_connection_bytes`). A Publish past it is refused
    /// (`RetryLater`), nothing copied. At least `max_request_bytes`.
    pub max_publish_bytes: u64,
    /// Descriptors of engine memory the daemon keeps open, over every connection: a pool whose
    /// memory is not sealed against shrinking keeps one (it is copied through it). Past it, such
    /// a pool is refused (`LimitExceeded`), so peers cannot take every descriptor the daemon
    /// may open (its accepts, segments and tokens need them).
    pub max_kept_files: usize,
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
            max_connections: 1024,
            max_connection_bytes: (1 << 30) + (128 << 20),
            send_timeout: Duration::from_secs(10),
            max_publish_bytes: 4 << 30,
            max_kept_files: DEFAULT_MAX_KEPT_FILES,
        }
    }
}

/// [`ServerConfig::max_kept_files`] by default; `orbitkv serve` sizes it from its open-files
/// limit.
pub const DEFAULT_MAX_KEPT_FILES: usize = 4096;

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
    /// Limits that do not fit together.
    #[error("bad server configuration: {0}")]
    Config(String),
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
    /// Every connection served now.
    conns: Mutex<HashMap<ConnId, Arc<Conn>>>,
    next_conn: AtomicU64,
    stop: AtomicBool,
    metrics: Metrics,
    committer: Committer,
    /// Publish copies held until stored, over every connection.
    publishes: Arc<conn::Memory>,
}

impl Shared {
    fn sessions(&self) -> MutexGuard<'_, Sessions> {
        self.sessions.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn conns(&self) -> MutexGuard<'_, HashMap<ConnId, Arc<Conn>>> {
        self.conns.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether the server is stopping.
    fn stopping(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }

    /// Counts `conn` among those served, unless that would pass the limit.
    fn admit(&self, conn: &Arc<Conn>) -> bool {
        let mut conns = self.conns();
        if conns.len() >= self.config.max_connections {
            return false;
        }
        conns.insert(conn.id, conn.clone());
        true
    }

    /// Connection `id` closed: its pending registration and sessions are forgotten, its pools
    /// detached (no copy touches its pages from here on), its leases ended.
    fn forget_conn(&self, id: ConnId) {
        self.sessions().disconnect(id);
        // A rank that registered again before this connection's session went may rejoin now.
        let events = self.sessions().rejoin_waiting();
        self.dispatch(events);
        let bridge = self
            .bridges
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&id);
        if let Some(b) = bridge {
            b.detach_all();
        }
        let ended = self.leases().drop_conn(&self.store, id);
        if ended > 0 {
            tracing::info!(
                conn = id,
                leases = ended,
                "connection closed: its leases ended"
            );
        }
        self.conns().remove(&id);
    }

    /// The page bytes of a Load or Publish, refused past the per-request byte limit.
    fn check_request_bytes(
        &self,
        what: &str,
        bridge: &orbitkv_gpu_bridge::Bridge,
        pages: impl Iterator<Item = (orbitkv_gpu_bridge::PageRef, u32, std::ops::Range<u32>)>,
    ) -> Result<u64, Refusal> {
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
        Ok(bytes)
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
        token: &orbitkv_protocol::message::Token,
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
            let (conn, reply, held) = match e {
                Event::Sealed { conn, reply, held } => {
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
                        (conn, refusal.message(), held)
                    } else {
                        inc(&self.metrics.seals);
                        (conn, reply, held)
                    }
                }
                Event::Refused {
                    conn,
                    refusal,
                    held,
                } => {
                    inc(&self.metrics.seal_refusals);
                    (conn, refusal.message(), held)
                }
            };
            // Queued without waiting: a rank that does not read delays no other.
            let target = self.conns().get(&conn).cloned();
            if let Some(c) = target {
                // The registration's bytes, counted while its round waited.
                c.memory.release(held);
                c.outbox
                    .send(c.register_request.load(Ordering::Acquire), &reply);
            }
        }
    }

    /// An instance sealed a new epoch: the leases of its earlier epochs end (their pins given
    /// back), and its namespace is registered in the store (durably, idempotently).
    fn on_sealed(&self, token: &orbitkv_protocol::message::Token) -> Result<(), Refusal> {
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
        let floor = config
            .max_request_bytes
            .saturating_add(u64::from(config.max_body));
        if config.max_connection_bytes < floor {
            return Err(ServeError::Config(format!(
                "the memory one connection may hold ({} bytes) must be at least one request's page bytes plus one message body ({floor} bytes)",
                config.max_connection_bytes
            )));
        }
        if config.max_publish_bytes < config.max_request_bytes {
            return Err(ServeError::Config(format!(
                "the Publish copies the daemon may hold ({} bytes) must be at least one request's page bytes ({} bytes)",
                config.max_publish_bytes, config.max_request_bytes
            )));
        }
        if config.max_connections == 0 {
            return Err(ServeError::Config(
                "at least one connection must be allowed".into(),
            ));
        }
        let listener = bind_private(&path).map_err(|e| io_err("binding", e))?;
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
                store,
                sessions: Mutex::new(Sessions::new(Box::new(OsRandom))),
                conns: Mutex::new(HashMap::new()),
                next_conn: AtomicU64::new(1),
                stop: AtomicBool::new(false),
                metrics: Metrics::default(),
                committer: Committer::default(),
                publishes: Arc::new(conn::Memory::new(config.max_publish_bytes)),
                config,
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

    /// Serves until stopped: accepts connections (each served by its own threads), runs the
    /// seal and lease timers and the committer. On stop: closes every connection, waits for
    /// their threads (each stops within the frame and send timeouts whatever its peer does),
    /// stops the committer after the bundle it is storing, removes the socket file.
    pub fn run(self) -> io::Result<()> {
        let shared = self.shared.clone();
        let timer = {
            let shared = shared.clone();
            std::thread::spawn(move || {
                while !shared.stopping() {
                    std::thread::sleep(Duration::from_millis(10));
                    let events = shared.sessions().expire(Instant::now());
                    shared.dispatch(events);
                    shared.leases().expire(&shared.store, Instant::now());
                }
            })
        };
        let (to_committer, from_encoder) = std::sync::mpsc::sync_channel(committer::BUNDLES_AHEAD);
        let encoder = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("orbitkv-encoder".into())
                .spawn(move || shared.committer.run_encoder(&shared, &to_committer))?
        };
        let committer = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("orbitkv-committer".into())
                .spawn(move || shared.committer.run(&shared, &from_encoder))?
        };
        let mut threads: Vec<JoinHandle<()>> = Vec::new();
        while !shared.stopping() {
            match self.listener.accept() {
                Ok((stream, _)) => {
                    if stream.set_nonblocking(false).is_err() {
                        continue;
                    }
                    let shared = shared.clone();
                    match std::thread::Builder::new()
                        .name("orbitkv-conn".into())
                        .spawn(move || conn::serve(&shared, stream))
                    {
                        Ok(t) => threads.push(t),
                        Err(e) => tracing::error!("no thread for a connection: {e}"),
                    }
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
        let conns: Vec<Arc<Conn>> = shared.conns().values().cloned().collect();
        for c in conns {
            c.outbox.close();
        }
        shared.committer.stop();
        for t in threads {
            let _ = t.join();
        }
        let _ = encoder.join();
        let _ = committer.join();
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

/// The refusal of a request the store failed: to be retried later (and when), refused for good,
/// or naming a namespace the store does not hold.
pub(crate) fn store_refusal(e: &orbitkv_store::Error, what: &str) -> Refusal {
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

/// Binds the control socket at `path` with mode 0660 from its first moment: bound inside a
/// fresh directory only the daemon's user can enter, given its mode there, then renamed into
/// place. (Binding at `path` and then changing the mode would leave it, for a moment, with the
/// umask's mode.) Where the temporary path would be too long for a socket address, it binds
/// in place and then sets the mode.
fn bind_private(path: &Path) -> io::Result<UnixListener> {
    use std::os::unix::fs::DirBuilderExt;
    let mode = std::fs::Permissions::from_mode(0o660);
    let parent = path.parent().unwrap_or(Path::new("."));
    let dir = parent.join(format!(".okv-{}", std::process::id()));
    let tmp = dir.join("s");
    let make = || std::fs::DirBuilder::new().mode(0o700).create(&dir);
    if let Err(e) = make() {
        if e.kind() != io::ErrorKind::AlreadyExists {
            return Err(e);
        }
        // Left by an earlier daemon of the same process id that died while binding.
        let _ = std::fs::remove_file(&tmp);
        std::fs::remove_dir(&dir)?;
        make()?;
    }
    let bound = UnixListener::bind(&tmp).and_then(|l| {
        std::fs::set_permissions(&tmp, mode.clone())?;
        std::fs::rename(&tmp, path)?;
        Ok(l)
    });
    let _ = std::fs::remove_file(&tmp);
    let _ = std::fs::remove_dir(&dir);
    match bound {
        Ok(l) => Ok(l),
        Err(e) if e.kind() == io::ErrorKind::InvalidInput => {
            let l = UnixListener::bind(path)?;
            std::fs::set_permissions(path, mode)?;
            Ok(l)
        }
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod bind_tests {
    use super::*;

    #[test]
    fn the_socket_is_bound_with_its_mode_and_leaves_no_directory() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let path = dir.path().join("orbitkv.sock");
        // A directory left by a daemon that died while binding is replaced.
        std::fs::create_dir(dir.path().join(format!(".okv-{}", std::process::id())))
            .unwrap_or_else(|e| panic!("{e}"));
        let l = bind_private(&path).unwrap_or_else(|e| panic!("{e}"));
        let mode = std::fs::metadata(&path)
            .unwrap_or_else(|e| panic!("{e}"))
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o660);
        let left: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap_or_else(|e| panic!("{e}"))
            .map(|e| e.map(|e| e.file_name()))
            .collect::<Result<_, _>>()
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(left, vec![std::ffi::OsString::from("orbitkv.sock")]);
        UnixStream::connect(&path).unwrap_or_else(|e| panic!("{e}"));
        drop(l);
    }
}
