//! The `orbitkv` Python package against the Rust client, through one `orbitkv serve` (its own
//! process, as engines meet it: both clients cross the same process boundary), each Python
//! number beside the Rust client's from the same run, repetitions interleaved (in turn first):
//!
//! - `query`: the round trip of one Query of 16 proven blocks, one after another, from Python
//!   (`Connection.query`) and from the Rust client, in turns of 100 (a machine's idle CPUs wake
//!   slower than busy ones, and that drifts: only fine interleaving compares like with like),
//!   1000 of each per repetition; the ratio of medians (target <= 1.3);
//! - `gil`: a Python thread counting in a loop, alone and while another Python thread issues
//!   Queries back to back, in turn (four phases of 0.5 s each a repetition), the Python process
//!   free to use every CPU; the median of the ratios of its rates (target >= 0.9);
//! - `transfer`: a Publish of 64 pages of 256 KiB from a host pool until durable, then an
//!   Acquire and a Load of the 64 pages, from Python and from the Rust client, 8 rounds of each
//!   side a repetition in turns; the median of the pairs' throughput ratios (target >= 0.9).
//!
//! The daemon runs on CPU 0 and both clients on CPU 1 (see `main`); the `gil` process is not
//! pinned.
//!
//! The Python side is `adapters/python/benches/client_side.py`, run by `ORBITKV_PYTHON`
//! (default: `.venv-python/bin/python`, where `scripts/test` installs the wheel).
//!
//! Run: `scripts/test` once (it builds and installs the wheel), then
//! `cargo build --release -p orbitkv && cargo bench -p orbitkv-benches --bench python_client`
//! (`ORBITKV_BENCH_ROUNDS`, default 5; `ORBITKV_BIN`, default `target/release/orbitkv`).
//! Not a CI gate: docs/performance.md records results.

#![expect(
    clippy::unwrap_used,
    reason = "a benchmark harness: a failed setup step ends the run"
)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use orbitkv_benches::{
    Sealed, block_hash as hash, chain_pages, env_u64, median_of as median, pin_to, unpin,
};
use orbitkv_gpu_bridge::{HostPool, PageRef};
use orbitkv_protocol::Message;
use orbitkv_protocol::message::{GroupHashes, LoadPage, PublishRequest, QueryRequest};
use orbitkv_sim::SimInstance;

const QUERY_BLOCKS: u32 = 16;
const QUERY_ROUNDS: u32 = 1000;
/// Queries of one side in a turn.
const QUERY_TURN: u32 = 100;
const PAGES: u32 = 64;
const PAGE_KIB: u32 = 256;
/// Publish-and-Load rounds of each side a repetition.
const TRANSFER_ROUNDS: u32 = 8;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn python() -> PathBuf {
    std::env::var_os("ORBITKV_PYTHON")
        .map_or_else(|| repo().join(".venv-python/bin/python"), PathBuf::from)
}

/// Runs the Python side in `mode`; its JSON document.
fn python_side(socket: &Path, name: &str, mode: &str, extra: &[&str]) -> serde_json::Value {
    let out = Command::new(python())
        .arg(repo().join("adapters/python/benches/client_side.py"))
        .arg(mode)
        .arg("--socket")
        .arg(socket)
        .arg("--name")
        .arg(name)
        .args(extra)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "the Python side failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn floats(v: &serde_json::Value, key: &str) -> Vec<f64> {
    v[key]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

/// `orbitkv serve` in its own process, its socket in `dir`; stopped (SIGTERM) when dropped.
struct Serve {
    socket: PathBuf,
    child: std::process::Child,
}

impl Serve {
    fn start(dir: &Path) -> Self {
        let bin = std::env::var_os("ORBITKV_BIN")
            .map_or_else(|| repo().join("target/release/orbitkv"), PathBuf::from);
        let socket = dir.join("orbitkv.sock");
        let child = Command::new(&bin)
            .arg("serve")
            .arg("--data-dir")
            .arg(dir.join("data"))
            .arg("--socket")
            .arg(&socket)
            .args(["--dram-bytes", "512MiB", "--ssd-bytes", "8GiB"])
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "{}: {e} (build it: cargo build --release -p orbitkv)",
                    bin.display()
                )
            });
        let deadline = Instant::now() + std::time::Duration::from_secs(60);
        while std::os::unix::net::UnixStream::connect(&socket).is_err() {
            assert!(Instant::now() < deadline, "orbitkv serve did not start");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        Self { socket, child }
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status();
        let _ = self.child.wait();
    }
}

/// A sealed one-worker Rust instance with a pool of `pages` pages written once.
struct RustSide {
    s: Sealed,
    pool: HostPool,
    sim: SimInstance,
    salt: u32,
}

impl RustSide {
    fn new(socket: &Path, sim: SimInstance, pages: u32, salt: u32) -> Self {
        let mut s = Sealed::seal(socket, &sim);
        let pool = s.register_pool(sim.pool_spec(1, pages));
        let page = sim.page_bytes() as usize;
        for i in 0..pages {
            pool.reuse(i).unwrap();
            let bytes: Vec<u8> = (0..page).map(|b| (b as u32 ^ i) as u8).collect();
            pool.write(i, 0, &bytes).unwrap();
        }
        Self { s, pool, sim, salt }
    }

    fn query(&self, round: u32, blocks: u32) -> QueryRequest {
        QueryRequest {
            token: self.s.scheduler_token,
            epoch: self.s.epoch,
            origin: 0,
            end: u64::from(self.sim.block_tokens * blocks),
            groups: vec![GroupHashes {
                group: 0,
                hashes: (0..blocks).map(|b| hash(self.salt, round, b)).collect(),
            }],
        }
    }

    /// Publishes blocks `0..n` of `round` from pages `0..n` until durable; seconds taken.
    fn publish(&mut self, round: u32, n: u32) -> f64 {
        let bt = u64::from(self.sim.block_tokens);
        let refs: Vec<PageRef> = (0..n).map(|i| self.pool.reuse(i).unwrap()).collect();
        let req = PublishRequest {
            token: self.s.worker_token,
            epoch: self.s.epoch,
            pages: chain_pages(self.salt, round, &refs, bt),
        };
        let t = Instant::now();
        let durable = self.s.worker.publish(req, |_| {}).unwrap();
        let took = t.elapsed().as_secs_f64();
        assert!(durable.pages.iter().all(|p| p.name() == "ok"));
        took
    }

    /// Acquires blocks `0..n` of `round` and loads them into pages `0..n`; the Load's seconds.
    fn load(&mut self, round: u32, n: u32) -> f64 {
        let q = self.query(round, n);
        let Message::Leased { lease, proof, .. } =
            self.s.scheduler.request(&Message::Acquire(q)).unwrap()
        else {
            panic!("not leased")
        };
        assert_eq!(proof.boundary, u64::from(self.sim.block_tokens * n));
        let pages: Vec<LoadPage> = (0..n)
            .map(|b| LoadPage {
                block: b,
                group: 0,
                rank: 0,
                page: self.pool.reuse(b).unwrap(),
                layer_start: 0,
                layer_end: self.sim.layers,
            })
            .collect();
        let t = Instant::now();
        let statuses = self
            .s
            .worker
            .load(orbitkv_protocol::message::LoadRequest {
                token: self.s.worker_token,
                epoch: self.s.epoch,
                lease,
                pages,
            })
            .unwrap();
        let took = t.elapsed().as_secs_f64();
        assert!(statuses.iter().all(|p| p.name() == "ok"));
        self.s
            .scheduler
            .release(self.s.scheduler_token, lease)
            .unwrap();
        took
    }
}

/// An interactive Python side (`query`, `transfer`), kept running: one line in, one JSON
/// document out.
struct PythonSide {
    child: std::process::Child,
    out: std::io::BufReader<std::process::ChildStdout>,
}

impl PythonSide {
    fn start(socket: &Path, mode: &str, name: &str, extra: &[&str]) -> Self {
        use std::io::BufRead;
        let mut child = Command::new(python())
            .arg(repo().join("adapters/python/benches/client_side.py"))
            .args([mode, "--name", name])
            .args(extra)
            .arg("--socket")
            .arg(socket)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "ready", "the Python side did not start");
        Self { child, out }
    }

    fn ask(&mut self, what: impl std::fmt::Display) -> serde_json::Value {
        use std::io::{BufRead, Write};
        let stdin = self.child.stdin.as_mut().unwrap();
        writeln!(stdin, "{what}").unwrap();
        stdin.flush().unwrap();
        let mut line = String::new();
        self.out.read_line(&mut line).unwrap();
        serde_json::from_str(&line).unwrap()
    }
}

impl Drop for PythonSide {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.wait();
    }
}

/// A turn of `n` Queries of the Rust side's published blocks: microseconds each.
fn rust_turn(side: &mut RustSide, q: &Message, n: u32) -> Vec<f64> {
    (0..n)
        .map(|_| {
            let t = Instant::now();
            let r = side.s.scheduler.request(q).unwrap();
            let took = t.elapsed().as_secs_f64() * 1e6;
            assert!(matches!(r, Message::Proof(_)));
            took
        })
        .collect()
}

/// A Rust instance with a pool of `PAGES` pages of `PAGE_KIB` KiB.
fn rust_transfer_side(socket: &Path, rep: u32) -> RustSide {
    let mut sim = SimInstance::new(&format!("rust-transfer-{rep}"), 1);
    sim.layers = PAGE_KIB / 64;
    sim.kv_heads = 8;
    sim.head_size = 128;
    RustSide::new(socket, sim, PAGES, 9)
}

fn main() {
    let reps = env_u64("ORBITKV_BENCH_ROUNDS", 5).max(1) as u32;
    let probe = Command::new(python())
        .args(["-c", "import orbitkv"])
        .output();
    if !probe.is_ok_and(|o| o.status.success()) {
        eprintln!(
            "{} cannot import orbitkv: run scripts/test first (it installs the wheel), or set ORBITKV_PYTHON",
            python().display()
        );
        std::process::exit(2);
    }
    let base =
        std::env::var("ORBITKV_BENCH_DIR").map_or_else(|_| repo().join("target"), PathBuf::from);
    std::fs::create_dir_all(&base).unwrap();
    let tmp = tempfile::tempdir_in(&base).unwrap();
    // Where the client runs beside the daemon moves a round trip by 2x here (a wakeup on the
    // daemon's own CPU is cheap, one on an idle CPU is not): the daemon on CPU 0, both clients
    // (and every process they start) on CPU 1, as an engine and a cache node's daemon sit on
    // different cores.
    let pinned = pin_to(0);
    let d = Serve::start(tmp.path());
    let pinned = pinned && pin_to(1);
    println!(
        "python-client bench: {reps} interleaved repetitions; {}",
        if pinned {
            "the daemon on CPU 0, both clients on CPU 1"
        } else {
            "unpinned (one CPU)"
        }
    );

    let (mut rust_q, mut py_q, mut rust_q99, mut py_q99) = (vec![], vec![], vec![], vec![]);
    let (mut gil, mut gil_queries) = (vec![], vec![]);
    let (mut publish_ratio, mut load_ratio) = (vec![], vec![]);
    let (mut rust_pub, mut py_pub, mut rust_load, mut py_load) = (vec![], vec![], vec![], vec![]);
    let pct = |mut v: Vec<f64>, p: f64| {
        v.sort_by(f64::total_cmp);
        v[((p / 100.0) * v.len() as f64).ceil() as usize - 1]
    };
    for rep in 0..reps {
        let mut side = RustSide::new(
            &d.socket,
            SimInstance::new(&format!("rust-query-{rep}"), 1),
            QUERY_BLOCKS,
            7,
        );
        side.publish(0, QUERY_BLOCKS);
        let q = Message::Query(side.query(0, QUERY_BLOCKS));
        let blocks = QUERY_BLOCKS.to_string();
        let mut py = PythonSide::start(
            &d.socket,
            "query",
            &format!("py-query-{rep}"),
            &["--blocks", &blocks],
        );
        let (mut r, mut p) = (Vec::new(), Vec::new());
        for turn in 0..QUERY_ROUNDS / QUERY_TURN {
            if (turn + rep) % 2 == 0 {
                r.extend(rust_turn(&mut side, &q, QUERY_TURN));
                p.extend(floats(&py.ask(QUERY_TURN), "rtt_us"));
            } else {
                p.extend(floats(&py.ask(QUERY_TURN), "rtt_us"));
                r.extend(rust_turn(&mut side, &q, QUERY_TURN));
            }
        }
        drop(py);
        drop(side);
        rust_q.push(pct(r.clone(), 50.0));
        rust_q99.push(pct(r, 99.0));
        py_q.push(pct(p.clone(), 50.0));
        py_q99.push(pct(p, 99.0));

        // The GIL's cost, not the CPU's: the Python process may use every CPU here, as on an
        // engine host (pinned to one, its Query thread's socket calls take CPU time from the
        // counting thread whatever the GIL does).
        unpin();
        let gil_name = format!("py-gil-{rep}");
        let g = python_side(&d.socket, &gil_name, "gil", &["--seconds", "0.5"]);
        if pinned {
            pin_to(1);
        }
        gil.extend(floats(&g, "ratios"));
        gil_queries.push(g["queries"].as_f64().unwrap() / g["seconds"].as_f64().unwrap());

        let page_kib = PAGE_KIB.to_string();
        let pages = PAGES.to_string();
        let mut py = PythonSide::start(
            &d.socket,
            "transfer",
            &format!("py-transfer-{rep}"),
            &["--pages", &pages, "--page-kib", &page_kib],
        );
        let mut rust = rust_transfer_side(&d.socket, rep);
        let bytes = (rust.sim.page_bytes() * u64::from(PAGES)) as f64;
        for round in 0..TRANSFER_ROUNDS {
            let r = rep * TRANSFER_ROUNDS + round;
            let rust_round =
                |rust: &mut RustSide| (rust.publish(1000 + r, PAGES), rust.load(1000 + r, PAGES));
            let ((rp, rl), t) = if (round + rep) % 2 == 0 {
                let x = rust_round(&mut rust);
                (x, py.ask(r))
            } else {
                let t = py.ask(r);
                (rust_round(&mut rust), t)
            };
            let (pp, pl) = (
                t["publish_s"].as_f64().unwrap(),
                t["load_s"].as_f64().unwrap(),
            );
            assert_eq!(
                t["bytes"].as_f64().unwrap(),
                bytes,
                "the same bytes on both sides"
            );
            rust_pub.push(bytes / rp / 1e9);
            py_pub.push(bytes / pp / 1e9);
            rust_load.push(bytes / rl / 1e9);
            py_load.push(bytes / pl / 1e9);
            publish_ratio.push(rp / pp);
            load_ratio.push(rl / pl);
        }
    }
    let (rq, pq) = (median(rust_q), median(py_q));
    println!(
        "query of {QUERY_BLOCKS} proven blocks, {QUERY_ROUNDS} round trips a side a repetition, in turns of {QUERY_TURN}: Rust client p50 {rq:.1} us (p99 {:.1}), Python p50 {pq:.1} us (p99 {:.1}); Python / Rust = {:.3} (target <= 1.3)",
        median(rust_q99),
        median(py_q99),
        pq / rq
    );
    let lo = gil.iter().copied().fold(f64::INFINITY, f64::min);
    println!(
        "GIL: a thread counting while another issues Queries back to back keeps {:.3} of its solo rate (median of {} phases; lowest {lo:.3}; target >= 0.9), while {:.0} Queries/s are answered",
        median(gil.clone()),
        gil.len(),
        median(gil_queries)
    );
    println!(
        "transfer of {PAGES} x {PAGE_KIB} KiB: Publish until durable, Rust {:.2} GB/s, Python {:.2} GB/s, Python / Rust per pair {:.3} (target >= 0.9); Load, Rust {:.2} GB/s, Python {:.2} GB/s, Python / Rust per pair {:.3} (target >= 0.9)",
        median(rust_pub),
        median(py_pub),
        median(publish_ratio),
        median(rust_load),
        median(py_load),
        median(load_ratio)
    );
}
