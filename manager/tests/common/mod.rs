//! Shared helpers: registrations of a simulated instance, a store in a temporary directory.

#![allow(dead_code, reason = "shared by several test files; each uses a subset")]

pub mod pages;
pub mod slow_io;
pub mod staged_device;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;

use orbitkv_manager::server::{Server, ServerConfig, Stopper};
use orbitkv_protocol::client::Client;

use orbitkv_protocol::message::Register;
use orbitkv_protocol::message::{GroupHashes, QueryRequest, Token};
use orbitkv_protocol::{Message, Role};
use orbitkv_sim::SimInstance;
use orbitkv_state::Namespace;
use orbitkv_store::{StateStore, StoreConfig};

/// The registration of `role`/`rank` in instance `instance` of `workers` ranks.
pub fn registration(instance: &str, role: Role, rank: u32, workers: u32) -> Register {
    let mut sim = SimInstance::new(instance, workers);
    sim.seal_timeout_ms = 1000;
    sim.registration(role, rank)
        .unwrap_or_else(|e| panic!("{e}"))
}

/// A store in `dir` (portable backend, manual durability).
pub fn store(dir: &Path) -> Arc<StateStore> {
    let mut c = StoreConfig::new(dir);
    c.durability = orbitkv_store::Durability::Manual;
    let io: Arc<dyn orbitkv_store::io::Io> = Arc::new(orbitkv_store::io::std_io::StdIo);
    Arc::new(StateStore::open(io, c).unwrap_or_else(|e| panic!("{e}")))
}

/// A store on the fault-injecting backend `io`, holding records back until durable as `orbitkv serve` does.
pub fn fault_store(io: &orbitkv_store::io::fault::FaultIo, read_only: bool) -> Arc<StateStore> {
    let mut c = StoreConfig::new("data");
    c.durability = orbitkv_store::Durability::Group;
    c.read_only = read_only;
    let io: Arc<dyn orbitkv_store::io::Io> = Arc::new(io.clone());
    Arc::new(StateStore::open(io, c).unwrap_or_else(|e| panic!("{e}")))
}

/// A daemon serving in a thread of this process, on a fresh store.
pub struct Daemon {
    pub socket: PathBuf,
    pub store: Arc<StateStore>,
    stopper: Stopper,
    thread: Option<JoinHandle<()>>,
    _dir: tempfile::TempDir,
}

impl Daemon {
    /// Starts one with `config` adjusted by `tune` (a 300 ms frame timeout by default).
    pub fn start_with(tune: impl FnOnce(&mut ServerConfig)) -> Self {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let store = store(&dir.path().join("data"));
        Self::serve(store, dir, tune)
    }

    /// Starts one serving `store`, its socket in `dir`.
    pub fn serve(
        store: Arc<StateStore>,
        dir: tempfile::TempDir,
        tune: impl FnOnce(&mut ServerConfig),
    ) -> Self {
        let socket = dir.path().join("orbitkv.sock");
        let mut config = ServerConfig::new(&socket);
        config.frame_timeout = std::time::Duration::from_millis(300);
        tune(&mut config);
        let server = Server::bind(config, store.clone()).unwrap_or_else(|e| panic!("{e}"));
        let stopper = server.stopper();
        let thread = std::thread::spawn(move || server.run().unwrap_or_else(|e| panic!("{e}")));
        Self {
            socket,
            store,
            stopper,
            thread: Some(thread),
            _dir: dir,
        }
    }

    /// Starts one serving `store` (its socket in a fresh temporary directory).
    pub fn on(store: Arc<StateStore>) -> Self {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        Self::serve(store, dir, |_| {})
    }

    /// Starts one with the defaults.
    pub fn start() -> Self {
        Self::start_with(|_| {})
    }

    /// A connected client that said hello.
    pub fn client(&self) -> Client {
        let mut c = Client::connect(&self.socket).unwrap_or_else(|e| panic!("{e}"));
        c.hello("test").unwrap_or_else(|e| panic!("{e}"));
        c
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.stopper.stop();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A sealed instance: its clients and its seal.
pub struct Sealed {
    pub scheduler: Client,
    /// Each worker's client and token, in rank order.
    pub workers: Vec<(Client, Token)>,
    pub epoch: u64,
    pub namespace: Namespace,
    pub token: Token,
}

pub fn seal(d: &Daemon, sim: &SimInstance) -> Sealed {
    seal_at(&d.socket, sim)
}

/// Seals `sim`'s ranks with the daemon listening on `socket`.
pub fn seal_at(socket: &Path, sim: &SimInstance) -> Sealed {
    let mut ranks = vec![(Role::Scheduler, 0)];
    ranks.extend((0..sim.workers).map(|r| (Role::Worker, r)));
    let threads: Vec<_> = ranks
        .into_iter()
        .map(|(role, rank)| {
            let (socket, sim) = (socket.to_path_buf(), sim.clone());
            std::thread::spawn(move || {
                let mut c = Client::connect(&socket).unwrap_or_else(|e| panic!("{e}"));
                let reg = sim
                    .registration(role, rank)
                    .unwrap_or_else(|e| panic!("{e}"));
                let m = c
                    .request(&Message::Register(reg))
                    .unwrap_or_else(|e| panic!("{e}"));
                (c, m)
            })
        })
        .collect();
    let mut out: Vec<(Client, Message)> = threads
        .into_iter()
        .map(|t| t.join().unwrap_or_else(|_| panic!("rank thread panicked")))
        .collect();
    let (scheduler, m) = out.remove(0);
    let Message::Sealed {
        epoch,
        namespace,
        token,
        ..
    } = m
    else {
        panic!("not sealed: {m:?}")
    };
    Sealed {
        scheduler,
        workers: out
            .into_iter()
            .map(|(c, m)| match m {
                Message::Sealed { token, .. } => (c, token),
                other => panic!("not sealed: {other:?}"),
            })
            .collect(),
        epoch,
        namespace: Namespace(namespace),
        token,
    }
}

/// A query of group 0 for the blocks with `hashes`, from token 0 to `end`, under `s`'s seal.
pub fn query(s: &Sealed, hashes: Vec<Vec<u8>>, end: u64) -> QueryRequest {
    QueryRequest {
        token: s.token,
        epoch: s.epoch,
        origin: 0,
        end,
        groups: vec![GroupHashes { group: 0, hashes }],
    }
}
