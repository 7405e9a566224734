//! Shared bench support: a recorder that keeps the per-iteration times criterion measured through
//! `iter_custom`, so each bench can print its subject/baseline ratio from the same run.

pub mod null_disk;
pub mod raw_uring;

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

static TIMES: Mutex<BTreeMap<String, Vec<f64>>> = Mutex::new(BTreeMap::new());

/// Records that `iters` iterations of `id` took `elapsed`, and returns `elapsed` for criterion.
pub fn record(id: &str, iters: u64, elapsed: Duration) -> Duration {
    if iters > 0
        && let Ok(mut t) = TIMES.lock()
    {
        t.entry(id.to_owned())
            .or_default()
            .push(elapsed.as_secs_f64() / iters as f64);
    }
    elapsed
}

/// Median seconds per iteration of `id`, if it ran.
pub fn median(id: &str) -> Option<f64> {
    let t = TIMES.lock().ok()?;
    let mut v = t.get(id)?.clone();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied()
}

/// Which way the target points.
#[derive(Debug, Clone, Copy)]
pub enum Target {
    /// The ratio must be at least this.
    AtLeast(f64),
    /// The ratio must be at most this.
    AtMost(f64),
}

/// Prints the ratio of `subject` to `baseline` with its target: the ratio of their median times
/// when `ratio_of_times`, else of their throughputs (baseline time / subject time).
pub fn report(name: &str, subject: &str, baseline: &str, ratio_of_times: bool, target: Target) {
    let (Some(s), Some(b)) = (median(subject), median(baseline)) else {
        println!("RATIO {name}: not measured (filtered out)");
        return;
    };
    // Throughput ratio = baseline time / subject time; time ratio = subject time / baseline time.
    let ratio = if ratio_of_times { s / b } else { b / s };
    let (ok, bound) = match target {
        Target::AtLeast(t) => (ratio >= t, format!(">= {t}")),
        Target::AtMost(t) => (ratio <= t, format!("<= {t}")),
    };
    println!(
        "RATIO {name}: {ratio:.4} (target {bound}: {}) [{subject}: {}, {baseline}: {}]",
        if ok { "met" } else { "NOT met" },
        human(s),
        human(b)
    );
}

/// Seconds in the unit that keeps three significant digits readable.
fn human(secs: f64) -> String {
    if secs >= 1.0 {
        format!("{secs:.3} s")
    } else if secs >= 1e-3 {
        format!("{:.3} ms", secs * 1e3)
    } else if secs >= 1e-6 {
        format!("{:.3} µs", secs * 1e6)
    } else {
        format!("{:.1} ns", secs * 1e9)
    }
}

/// Pins the calling thread (and the threads it spawns afterwards) to `cpu`; false when the
/// machine has one CPU or the call fails (then nothing is pinned).
#[expect(unsafe_code, reason = "sched_setaffinity has no safe wrapper in std")]
pub fn pin_to(cpu: usize) -> bool {
    if online_cpus() < 2 {
        return false;
    }
    // SAFETY: an all-zero cpu_set_t is the empty set; CPU_SET writes inside it; the call reads
    // `size_of::<cpu_set_t>()` bytes of it and applies to the calling thread (pid 0).
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set) == 0
    }
}

/// CPUs online (not the calling thread's affinity, which `available_parallelism` reports).
#[expect(unsafe_code, reason = "sysconf has no safe wrapper in std")]
fn online_cpus() -> usize {
    // SAFETY: sysconf reads a system value; it has no memory effects.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    usize::try_from(n).unwrap_or(1).max(1)
}

/// Lets the calling thread run on every CPU again (undoes [`pin_to`]).
#[expect(unsafe_code, reason = "sched_setaffinity has no safe wrapper in std")]
pub fn unpin() {
    let n = online_cpus().min(libc::CPU_SETSIZE as usize);
    // SAFETY: as in `pin_to`; the set names CPUs 0..n.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for cpu in 0..n {
            libc::CPU_SET(cpu, &mut set);
        }
        libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set);
    }
}

/// The environment variable `name` as a number, or `default`.
pub fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The median of `v` (the upper one of an even count); `v` must not be empty.
pub fn median_of(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// A 32-byte block hash for block `block` of round `round` of a publisher `salt`: distinct for
/// each triple, so no two benches' blocks meet in the store.
pub fn block_hash(salt: u32, round: u32, block: u32) -> Vec<u8> {
    let mut h = vec![0u8; 32];
    h[..4].copy_from_slice(&salt.to_le_bytes());
    h[4..8].copy_from_slice(&round.to_le_bytes());
    h[8..12].copy_from_slice(&block.to_le_bytes());
    h[31] = 0xC7;
    h
}

/// The Publish pages of blocks `0..` of round `round` of publisher `salt`, block `b` from
/// `pages[b]`, `block_tokens` tokens each, group 0, rank 0, chained by parent hash.
pub fn chain_pages(
    salt: u32,
    round: u32,
    pages: &[orbitkv_gpu_bridge::PageRef],
    block_tokens: u64,
) -> Vec<orbitkv_protocol::message::PublishPage> {
    (0u32..)
        .zip(pages)
        .map(|(b, p)| orbitkv_protocol::message::PublishPage {
            group: 0,
            rank: 0,
            hash: block_hash(salt, round, b),
            parent: if b == 0 {
                Vec::new()
            } else {
                block_hash(salt, round, b - 1)
            },
            start: u64::from(b) * block_tokens,
            end: u64::from(b + 1) * block_tokens,
            page: *p,
        })
        .collect()
}

/// The daemon in process, as `orbitkv serve` runs it: the probed backend (O_DIRECT where it
/// works), records held back until a group commit made them durable, a DRAM tier of
/// `dram_bytes`; its socket in `dir`. Stopped when dropped.
pub struct Daemon {
    /// Its socket.
    pub socket: std::path::PathBuf,
    /// Its metrics text, rendered on call.
    pub metrics: Box<dyn Fn() -> String>,
    stopper: orbitkv_manager::server::Stopper,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Daemon {
    /// Starts one on a store in `dir/data`.
    pub fn start(dir: &std::path::Path, dram_bytes: u64) -> Self {
        Self::start_on(dir, dram_bytes, None, false)
    }

    /// As [`Daemon::start`], with an SSD budget of `ssd_bytes` (none: unbounded); with
    /// `null_disk`, the store's payload writes never reach the disk ([`null_disk::NullDisk`]).
    #[expect(
        clippy::unwrap_used,
        reason = "a benchmark harness: a failed setup step ends the run"
    )]
    pub fn start_on(
        dir: &std::path::Path,
        dram_bytes: u64,
        ssd_bytes: Option<u64>,
        null_disk: bool,
    ) -> Self {
        use orbitkv_store::{Durability, StateStore, StoreConfig};
        let data = dir.join("data");
        std::fs::create_dir_all(&data).unwrap();
        let (io, direct) = orbitkv_store::io::default_for(&data);
        let io: std::sync::Arc<dyn orbitkv_store::io::Io> = if null_disk {
            std::sync::Arc::new(null_disk::NullDisk(io))
        } else {
            io
        };
        let mut c = StoreConfig::new(&data);
        c.durability = Durability::Group;
        if direct {
            c.alignment = orbitkv_segments::Alignment::Direct;
        }
        c.dram_bytes = dram_bytes;
        // Segments are then a 64th of the budget at most (the store clamps them).
        c.ssd_bytes = ssd_bytes;
        let store = std::sync::Arc::new(StateStore::open(io, c).unwrap());
        let socket = dir.join("orbitkv.sock");
        let server = orbitkv_manager::server::Server::bind(
            orbitkv_manager::server::ServerConfig::new(&socket),
            store,
        )
        .unwrap();
        let stopper = server.stopper();
        let metrics = Box::new(server.metrics_source());
        let thread = std::thread::spawn(move || server.run().unwrap());
        Self {
            socket,
            metrics,
            stopper,
            thread: Some(thread),
        }
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

/// A sealed one-worker instance: the scheduler's and the worker's clients and tokens, and the
/// epoch.
pub struct Sealed {
    /// The scheduler's connection (its session's token asks the queries).
    pub scheduler: orbitkv_protocol::client::Client,
    /// The scheduler's token.
    pub scheduler_token: orbitkv_protocol::message::Token,
    /// The worker's connection.
    pub worker: orbitkv_protocol::client::Client,
    /// The worker's token.
    pub worker_token: orbitkv_protocol::message::Token,
    /// The seal's epoch.
    pub epoch: u64,
}

impl Sealed {
    /// Registers `sim`'s scheduler and its one worker on `socket` (each on its own connection,
    /// at once) and waits for the seal.
    #[expect(
        clippy::unwrap_used,
        reason = "a benchmark harness: a failed setup step ends the run"
    )]
    pub fn seal(socket: &std::path::Path, sim: &orbitkv_sim::SimInstance) -> Self {
        use orbitkv_protocol::client::Client;
        use orbitkv_protocol::{Message, Role};
        let threads: Vec<_> = [(Role::Scheduler, 0), (Role::Worker, 0)]
            .into_iter()
            .map(|(role, rank)| {
                let (socket, sim) = (socket.to_owned(), sim.clone());
                std::thread::spawn(move || {
                    let mut c = Client::connect(&socket).unwrap();
                    c.hello("bench").unwrap();
                    let m = c
                        .request(&Message::Register(sim.registration(role, rank).unwrap()))
                        .unwrap();
                    let Message::Sealed { token, epoch, .. } = m else {
                        panic!("not sealed: {m:?}")
                    };
                    (c, token, epoch)
                })
            })
            .collect();
        let mut out: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        let (worker, worker_token, epoch) = out.pop().unwrap();
        let (scheduler, scheduler_token, _) = out.pop().unwrap();
        Self {
            scheduler,
            scheduler_token,
            worker,
            worker_token,
            epoch,
        }
    }

    /// The worker registers a host pool of `spec`.
    #[expect(
        clippy::unwrap_used,
        reason = "a benchmark harness: a failed setup step ends the run"
    )]
    pub fn register_pool(
        &mut self,
        spec: orbitkv_gpu_bridge::PoolSpec,
    ) -> orbitkv_gpu_bridge::HostPool {
        use orbitkv_protocol::Message;
        let pool = orbitkv_gpu_bridge::HostPool::create(spec.clone()).unwrap();
        let id = self
            .worker
            .send_with_fd(
                &Message::RegisterPool {
                    token: self.worker_token,
                    spec,
                    memory: orbitkv_gpu_bridge::PageMemory::Host,
                },
                pool.fd(),
            )
            .unwrap();
        assert!(matches!(
            self.worker.reply(id).unwrap(),
            Message::PoolRegistered { .. }
        ));
        pool
    }
}
