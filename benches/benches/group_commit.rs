//! Durability off the request path and group commit, through the daemon's Unix socket (in
//! process: daemon threads, client threads), each number against a baseline measured in the
//! same run, rounds interleaved:
//!
//! - `behind`: a Query sent on a publisher's own connection once its PublishCopied has arrived,
//!   while its PublishDurable is still pending (a Publish of 16 pages of 2 MiB), vs the same
//!   Query on an idle connection at the same time (each proving the previous Publish's blocks,
//!   the newest durable ones, which no reclaim has taken); p50 and p99 of each (target: p99
//!   ratio <= 2); and, shown beside, the same Query once no Publish is pending;
//! - `durable`: PublishDurable throughput with 1, 2 and 8 publishers (each its own instance on
//!   its own connection, publishing 16 pages of 256 KiB at a time, reusing its pages once
//!   copied — their bytes written once, as a GPU would write them, not by the CPUs the daemon
//!   uses — with up to 4 Publishes waiting to be durable; 512 MiB a repetition, after a
//!   discarded warm-up that fills the daemon's SSD budget of 4 GiB, so that each repetition
//!   reclaims as much as it writes, as a cache node's store does, and the DRAM tier with
//!   copies of this page size) vs raw O_DIRECT writes of the same bytes to one file with one
//!   fdatasync per batch (a batch: one Publish of every publisher), from a buffer on huge
//!   pages as the store's write buffers are (on scattered 4 KiB pages the same writes run up
//!   to a third slower); each repetition pairs a daemon run with a raw run, in turn first,
//!   and the ratio is the median of the pairs' (target >= 0.8). Beside it, not gating: the
//!   same batches through io_uring with 4 writes in flight, as the store submits them.
//!
//! Run: `cargo bench -p orbitkv-benches --bench group_commit` (environment:
//! `ORBITKV_BENCH_ROUNDS`, default 5; `ORBITKV_BENCH_DIR`, default a temporary directory under
//! `target/`, which must take O_DIRECT; `ORBITKV_BENCH_PUBLISHERS`, default `1,2,8`;
//! `ORBITKV_BENCH_BEHIND=0` skips `behind`, to profile one part alone;
//! `ORBITKV_BENCH_NULL_DISK=1` drops the daemon's payload writes before they reach the disk,
//! to measure its own ceiling against the same raw baselines). Not a CI gate:
//! docs/performance.md records results.

#![expect(
    clippy::unwrap_used,
    reason = "a benchmark harness: a failed setup step ends the run"
)]

use std::fs::OpenOptions;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Barrier};
use std::time::Instant;

use orbitkv_benches::raw_uring::RawUring;
use orbitkv_benches::{
    Daemon, Sealed, block_hash as hash, chain_pages, env_u64, median_of as median,
};
use orbitkv_gpu_bridge::{HostPool, PageRef};
use orbitkv_protocol::client::Client;
use orbitkv_protocol::message::{GroupHashes, PublishRequest, QueryRequest};
use orbitkv_protocol::{Message, PageStatus};
use orbitkv_sim::SimInstance;
use orbitkv_store::io::aligned::write_vec;

/// Pages per Publish.
const PAGES: u32 = 16;
/// The daemon's DRAM tier.
const DRAM_BYTES: u64 = 256 << 20;
/// The daemon's SSD budget (segments of a 64th of it): a cache node's store runs full, so
/// every repetition reclaims segments as it writes.
const SSD_BYTES: u64 = 4 << 30;
/// Publishes one publisher has waiting to be durable at most.
const DEPTH: usize = 4;

fn percentile(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * v.len() as f64).ceil() as usize;
    v[rank.clamp(1, v.len()) - 1]
}

/// An instance whose pages are `layers` × 64 KiB (16 tokens × 8 KV heads × 128 × K,V × 2 B).
fn instance(name: &str, layers: u32) -> SimInstance {
    let mut s = SimInstance::new(name, 1);
    s.layers = layers;
    s.kv_heads = 8;
    s.head_size = 128;
    s
}

/// A sealed instance with its worker's pool registered.
struct Publisher {
    s: Sealed,
    pool: HostPool,
    salt: u32,
    sim: SimInstance,
}

impl Publisher {
    fn seal(socket: &Path, sim: SimInstance, salt: u32) -> Self {
        let mut s = Sealed::seal(socket, &sim);
        let pool = s.register_pool(sim.pool_spec(1, PAGES));
        Self { s, pool, salt, sim }
    }

    /// Writes `src` into the pool's pages (once: an engine's pages are written by its GPU, not
    /// by a CPU the daemon shares).
    fn fill(&self, src: &[u8]) {
        let page = self.sim.page_bytes() as usize;
        for i in 0..PAGES {
            self.pool.reuse(i).unwrap();
            self.pool
                .write(i, 0, &src[i as usize * page..][..page])
                .unwrap();
        }
    }

    /// Reuses the pool's pages for round `round` (new generations, the bytes `fill` wrote);
    /// the Publish naming them.
    fn prepare(&self, round: u32) -> Message {
        let pages: Vec<PageRef> = (0..PAGES).map(|i| self.pool.reuse(i).unwrap()).collect();
        Message::Publish(PublishRequest {
            token: self.s.worker_token,
            epoch: self.s.epoch,
            pages: chain_pages(self.salt, round, &pages, 16),
        })
    }

    /// Sends `publish` and waits for its PublishCopied; returns its request id.
    fn until_copied(&mut self, publish: &Message) -> u64 {
        let id = self.s.worker.send(publish).unwrap();
        let Message::PublishCopied { pages } = self.s.worker.reply(id).unwrap() else {
            panic!("no PublishCopied")
        };
        assert!(pages.iter().all(|p| *p == PageStatus::Ok));
        id
    }

    /// Waits for the PublishDurable of request `id`.
    fn until_durable(&mut self, id: u64) {
        let Message::PublishDurable { pages, .. } = self.s.worker.reply(id).unwrap() else {
            panic!("no PublishDurable")
        };
        assert!(pages.iter().all(|p| *p == PageStatus::Ok));
    }

    fn query(&self, round: u32, blocks: u32) -> Message {
        Message::Query(QueryRequest {
            token: self.s.scheduler_token,
            epoch: self.s.epoch,
            origin: 0,
            end: 16 * u64::from(blocks),
            groups: vec![GroupHashes {
                group: 0,
                hashes: (0..blocks).map(|b| hash(self.salt, round, b)).collect(),
            }],
        })
    }
}

fn source(bytes: usize, salt: u32) -> Vec<u8> {
    (0..bytes)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).wrapping_add(salt) as u8)
        .collect()
}

/// Raw baseline through io_uring, as the store writes: `rounds` batches, each `publishers`
/// writes of `bytes` (O_DIRECT, one file, sequential, [`URING_DEPTH`] in flight) and one
/// fdatasync once they complete; returns seconds.
fn raw_uring_batches(path: &Path, src: &[u8], publishers: usize, rounds: u32) -> f64 {
    let (mut buf, pad) = write_vec(src.len());
    buf.extend_from_slice(src);
    let data = &buf[pad..pad + src.len()];
    let mut w = RawUring::create(path, URING_DEPTH);
    let t = Instant::now();
    let mut at = 0u64;
    for _ in 0..rounds {
        for _ in 0..publishers {
            w.write(data, at);
            at += data.len() as u64;
        }
        w.sync();
    }
    let secs = t.elapsed().as_secs_f64();
    drop(w);
    let _ = std::fs::remove_file(path);
    secs
}

/// Writes in flight in the io_uring baseline: as many as the store keeps per segment.
const URING_DEPTH: usize = 4;

/// Raw baseline: `rounds` batches, each `publishers` writes of `bytes` (O_DIRECT, one file,
/// sequential) and one fdatasync; returns seconds.
fn raw_batches(path: &Path, src: &[u8], publishers: usize, rounds: u32) -> f64 {
    let f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
        .unwrap();
    let (mut buf, pad) = write_vec(src.len());
    buf.extend_from_slice(src);
    let data = &buf[pad..pad + src.len()];
    let t = Instant::now();
    let mut at = 0u64;
    for _ in 0..rounds {
        for _ in 0..publishers {
            f.write_all_at(data, at).unwrap();
            at += data.len() as u64;
        }
        f.sync_data().unwrap();
    }
    let secs = t.elapsed().as_secs_f64();
    drop(f);
    let _ = std::fs::remove_file(path);
    secs
}

fn main() {
    let reps = env_u64("ORBITKV_BENCH_ROUNDS", 5).max(1) as u32;
    let base = std::env::var("ORBITKV_BENCH_DIR").map_or_else(
        |_| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target"),
        PathBuf::from,
    );
    std::fs::create_dir_all(&base).unwrap();
    let tmp = tempfile::tempdir_in(&base).unwrap();
    let null_disk = env_u64("ORBITKV_BENCH_NULL_DISK", 0) != 0;
    let d = Daemon::start_on(tmp.path(), DRAM_BYTES, Some(SSD_BYTES), null_disk);
    println!(
        "group-commit bench: {reps} interleaved repetitions{}",
        if null_disk {
            "; the daemon's payload writes dropped before the disk (its own ceiling)"
        } else {
            ""
        }
    );
    let publisher_counts = env_list("ORBITKV_BENCH_PUBLISHERS", &[1, 2, 8]);
    if env_u64("ORBITKV_BENCH_BEHIND", 1) != 0 {
        behind(&d, reps);
    }
    durable(&d, tmp.path(), reps, &publisher_counts);
}

/// A comma-separated list of counts from the environment, or `default`.
fn env_list(name: &str, default: &[usize]) -> Vec<usize> {
    std::env::var(name).map_or_else(
        |_| default.to_vec(),
        |v| v.split(',').map(|n| n.trim().parse().unwrap()).collect(),
    )
}

/// The Query behind a pending PublishDurable.
fn behind(d: &Daemon, reps: u32) {
    // Behind: 16 x 2 MiB Publishes, a Query on the same connection while each is pending.
    let mut p = Publisher::seal(&d.socket, instance("behind", 32), 1);
    let page = p.sim.page_bytes() as usize;
    let src = source(page * PAGES as usize, 1);
    p.fill(&src);
    let first = p.prepare(0);
    let id = p.until_copied(&first);
    p.until_durable(id);
    let mut idle = Client::connect(&d.socket).unwrap();
    let (mut behind, mut beside, mut quiet) = (Vec::new(), Vec::new(), Vec::new());
    let (mut pending_seen, mut total) = (0u32, 0u32);
    let timed = |c: &mut Client, q: &Message| {
        let t = Instant::now();
        let id = c.send(q).unwrap();
        let r = c.reply(id).unwrap();
        assert!(matches!(r, Message::Proof(_)));
        t.elapsed().as_secs_f64()
    };
    for round in 1..=reps * 40 {
        // The last Publish's blocks: durable, and the newest, so no reclaim has taken them.
        let q = p.query(round - 1, PAGES);
        let publish = p.prepare(round);
        let id = p.until_copied(&publish);
        // The same Query on the publisher's connection and on an idle one, both while the
        // Publish is being made durable (in turn first, so neither always goes first).
        if round % 2 == 0 {
            behind.push(timed(&mut p.s.worker, &q));
            beside.push(timed(&mut idle, &q));
        } else {
            beside.push(timed(&mut idle, &q));
            behind.push(timed(&mut p.s.worker, &q));
        }
        // Was the PublishDurable still pending then? (Had it come first, the client would
        // have kept it aside and this would return at once.)
        let before = Instant::now();
        p.until_durable(id);
        if before.elapsed().as_micros() > 100 {
            pending_seen += 1;
        }
        total += 1;
        // And once the machine is quiet again.
        quiet.push(timed(&mut idle, &q));
    }
    let (b50, b99) = (percentile(&mut behind, 50.0), percentile(&mut behind, 99.0));
    let (s50, s99) = (percentile(&mut beside, 50.0), percentile(&mut beside, 99.0));
    let (q50, q99) = (percentile(&mut quiet, 50.0), percentile(&mut quiet, 99.0));
    println!(
        "behind a Publish of {PAGES} x {} MiB ({pending_seen} of {total} still pending after both Queries): on the publisher's connection p50 {:.1} us p99 {:.1} us; on an idle connection at the same time p50 {:.1} us p99 {:.1} us; behind / idle = {:.2} at p50, {:.2} at p99 (target <= 2 at p99); on an idle connection with no Publish pending p50 {:.1} us p99 {:.1} us (behind / that = {:.2} at p99)",
        page >> 20,
        b50 * 1e6,
        b99 * 1e6,
        s50 * 1e6,
        s99 * 1e6,
        b50 / s50,
        b99 / s99,
        q50 * 1e6,
        q99 * 1e6,
        b99 / q99
    );
}

/// Durable throughput with `counts` publishers vs raw O_DIRECT batches.
fn durable(d: &Daemon, dir: &Path, reps: u32, counts: &[usize]) {
    // Every repetition moves this many bytes, whatever the number of publishers: long enough
    // for the disk's and the CPUs' jitter to average out.
    const REP_BYTES: usize = 512 << 20;
    for &publishers in counts {
        let mut pubs: Vec<Publisher> = (0..publishers)
            .map(|i| {
                Publisher::seal(
                    &d.socket,
                    instance(&format!("durable-{publishers}-{i}"), 4),
                    100 + i as u32,
                )
            })
            .collect();
        let page = pubs[0].sim.page_bytes() as usize;
        let per_publish = page * PAGES as usize;
        let src = source(per_publish, 7);
        for p in &pubs {
            p.fill(&src);
        }
        let rounds = (REP_BYTES / (per_publish * publishers)).max(DEPTH) as u32;
        let bytes = (per_publish * publishers) as f64 * f64::from(rounds);
        let (mut daemon, mut raw, mut uring) = (Vec::new(), Vec::new(), Vec::new());
        // Discarded warm-up: Publishes of the SSD budget, so that the store is full (each
        // repetition then reclaims as much as it writes) and the DRAM tier holds copies of
        // this page size (whose memory each new copy takes over), as on a server publishing
        // pages of one size after its first hours.
        let warm = (SSD_BYTES.max(DRAM_BYTES) / bytes as u64).max(1) as u32 + 1;
        let mut ratios = Vec::new();
        let raw_file = dir.join("raw.bin");
        for rep in 0..warm + reps {
            // The disk's speed drifts over seconds: each repetition pairs a daemon run with a
            // raw run next to it, in turn first, and the ratio is taken per pair.
            let raw_first = rep % 2 == 1;
            let raw_took = raw_first.then(|| raw_batches(&raw_file, &src, publishers, rounds));
            let barrier = Arc::new(Barrier::new(publishers));
            let t = Instant::now();
            std::thread::scope(|sc| {
                for p in pubs.iter_mut() {
                    let barrier = barrier.clone();
                    sc.spawn(move || {
                        barrier.wait();
                        // As an engine publishes: its pages are reused once copied, while
                        // up to DEPTH earlier Publishes wait to be durable.
                        let mut waiting = std::collections::VecDeque::new();
                        for r in 0..rounds {
                            let publish = p.prepare(1000 + rep * rounds + r);
                            waiting.push_back(p.until_copied(&publish));
                            if waiting.len() >= DEPTH
                                && let Some(id) = waiting.pop_front()
                            {
                                p.until_durable(id);
                            }
                        }
                        while let Some(id) = waiting.pop_front() {
                            p.until_durable(id);
                        }
                    });
                }
            });
            let took = t.elapsed().as_secs_f64();
            let raw_took =
                raw_took.unwrap_or_else(|| raw_batches(&raw_file, &src, publishers, rounds));
            // Beside it, not gating: the same bytes through io_uring as the store writes them.
            let uring_took = raw_uring_batches(&raw_file, &src, publishers, rounds);
            if rep >= warm {
                daemon.push(took);
                raw.push(raw_took);
                uring.push(uring_took);
                ratios.push(raw_took / took);
            }
        }
        let (dm, rm, um) = (median(daemon), median(raw), median(uring));
        let (lo, hi) = ratios
            .iter()
            .fold((f64::MAX, 0f64), |(lo, hi), r| (lo.min(*r), hi.max(*r)));
        println!(
            "durable, {publishers} publisher(s) x {rounds} Publishes of {PAGES} x {} KiB: daemon {:.2} GB/s, raw O_DIRECT with one fdatasync per batch {:.2} GB/s (medians); daemon / raw per pair: median {:.3}, range {lo:.2}-{hi:.2} (target >= 0.8); beside it, the same batches through io_uring with {URING_DEPTH} in flight {:.2} GB/s",
            page >> 10,
            bytes / dm / 1e9,
            bytes / rm / 1e9,
            median(ratios),
            bytes / um / 1e9,
        );
    }
}
