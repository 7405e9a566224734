//! The daemon's hot path end to end over its Unix socket, in process (daemon thread, client
//! threads), each number against a baseline measured in the same run, rounds interleaved and
//! medians (or percentiles over every round) reported:
//!
//! - `query`: the round trip of a Query that proves 32 blocks (p50 and p99) vs a raw echo of the
//!   same request and reply frames over the same kind of socket (an echo thread that reads the
//!   frame and writes a reply of the daemon's reply size; the client encodes and decodes both
//!   the same way);
//! - `pipelined`: 64 such Queries sent at once on one connection, the replies matched by
//!   request id, vs the same 64 one at a time, vs one round trip, vs 64 times the daemon's own
//!   service time (p50 of 10 bursts a round);
//! - `load`: a Load of 64 pages of 256 KiB (16 MiB, the records pinned under a lease, verified on
//!   the way out of the store, fenced into a host pool) vs `memcpy` of the same bytes;
//! - `publish`: a Publish of 64 such pages until PublishCopied (the engine may reuse its pages)
//!   vs `memcpy` of the same bytes, and vs `memcpy` out of the pages just written by the
//!   engine's thread on the other CPU (the daemon's copy-out has that cross-CPU cache traffic);
//!   and until PublishDurable (stored with a sync: the disk's rate, shown beside).
//!
//! With two CPUs or more, the daemon's threads and the echo thread run on CPU 1 and the clients on
//! CPU 0, so both servers see the same wake-up path.
//!
//! Run: `cargo bench -p orbitkv-benches --bench hot_path` (environment: `ORBITKV_BENCH_ROUNDS`,
//! default 20; `ORBITKV_BENCH_QUERIES` per round, default 1000, alternating with the echo in
//! runs of 100; `ORBITKV_BENCH_DIR`, default a
//! temporary directory under `target/`). Not a CI gate: docs/performance.md records results.

#![expect(
    clippy::unwrap_used,
    reason = "a benchmark harness: a failed setup step ends the run"
)]

use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::thread::JoinHandle;
use std::time::Instant;

use orbitkv_benches::{Daemon, Sealed, env_u64, median_of as median};
use orbitkv_gpu_bridge::PageRef;
use orbitkv_protocol::client::Client;
use orbitkv_protocol::message::{
    GroupHashes, LoadPage, LoadRequest, PublishPage, PublishRequest, QueryRequest,
};
use orbitkv_protocol::{DEFAULT_MAX_BODY, Message, read_frame};
use orbitkv_sim::SimInstance;

/// Pages per Load or Publish.
const PAGES: u32 = 64;
/// Blocks a query proves.
const QUERY_BLOCKS: usize = 32;

fn percentile(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * v.len() as f64).ceil() as usize;
    v[rank.clamp(1, v.len()) - 1]
}

/// 4 layers × 16 tokens × 8 KV heads × 128 elements × K and V × 2 bytes = 256 KiB per page.
fn instance() -> SimInstance {
    let mut s = SimInstance::new("bench", 1);
    s.layers = 4;
    s.kv_heads = 8;
    s.head_size = 128;
    s
}

fn hash(round: u32, block: u32) -> Vec<u8> {
    let mut h = vec![0u8; 32];
    h[..4].copy_from_slice(&round.to_le_bytes());
    h[4..8].copy_from_slice(&block.to_le_bytes());
    h[31] = 0xB3;
    h
}

fn publish_request(s: &Sealed, round: u32, pages: &[PageRef]) -> Message {
    let bt = 16u64;
    Message::Publish(PublishRequest {
        token: s.worker_token,
        epoch: s.epoch,
        pages: pages
            .iter()
            .enumerate()
            .map(|(b, page)| {
                let b = b as u32;
                PublishPage {
                    group: 0,
                    rank: 0,
                    hash: hash(round, b),
                    parent: if b == 0 { vec![] } else { hash(round, b - 1) },
                    start: u64::from(b) * bt,
                    end: u64::from(b + 1) * bt,
                    page: *page,
                }
            })
            .collect(),
    })
}

fn query(s: &Sealed, round: u32, blocks: usize) -> QueryRequest {
    QueryRequest {
        token: s.scheduler_token,
        epoch: s.epoch,
        origin: 0,
        end: 16 * blocks as u64,
        groups: vec![GroupHashes {
            group: 0,
            hashes: (0..blocks as u32).map(|b| hash(round, b)).collect(),
        }],
    }
}

/// An echo server: reads each frame, answers with `reply` under the frame's request id. Its
/// thread runs on `cpu` (where the daemon's threads run), so both servers are as far from the
/// client.
fn echo(listener: UnixListener, reply: Message, cpu: usize) -> JoinHandle<()> {
    std::thread::spawn(move || {
        orbitkv_benches::pin_to(cpu);
        let (mut s, _) = listener.accept().unwrap();
        while let Ok((h, _body)) = read_frame(&mut s, DEFAULT_MAX_BODY) {
            let bytes = reply.encode_frame(h.request).unwrap();
            if std::io::Write::write_all(&mut s, &bytes).is_err() {
                return;
            }
        }
    })
}

/// The daemon's mean service time for requests of `kind`, in seconds, from its histogram.
fn daemon_mean(metrics: &str, kind: &str) -> f64 {
    let value = |name: String| -> f64 {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(&name)?.trim().parse().ok())
            .unwrap_or(0.0)
    };
    value(format!("orbitkv_request_seconds_sum{{kind=\"{kind}\"}}"))
        / value(format!("orbitkv_request_seconds_count{{kind=\"{kind}\"}}")).max(1.0)
}

fn main() {
    let rounds = env_u64("ORBITKV_BENCH_ROUNDS", 20).max(1);
    let queries = env_u64("ORBITKV_BENCH_QUERIES", 1000).max(1);
    let base = std::env::var("ORBITKV_BENCH_DIR").map_or_else(
        |_| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target"),
        PathBuf::from,
    );
    std::fs::create_dir_all(&base).unwrap();
    let tmp = tempfile::tempdir_in(&base).unwrap();
    // The daemon's threads (spawned now, inheriting the mask) on CPU 1, the clients on CPU 0:
    // on a virtual machine a wake-up's cost depends on where the threads run, so the daemon and
    // the echo baseline get the same placement.
    let pinned = orbitkv_benches::pin_to(1);
    let d = Daemon::start(tmp.path(), 1 << 30);
    if pinned {
        orbitkv_benches::pin_to(0);
    }
    let sim = instance();
    let page_bytes = sim.page_bytes() as usize;
    let bytes = page_bytes * PAGES as usize;
    println!(
        "hot-path bench: {rounds} interleaved rounds; {PAGES} pages of {} KiB per Load/Publish; {queries} queries per round; {}",
        page_bytes >> 10,
        if pinned {
            "servers on CPU 1, clients on CPU 0"
        } else {
            "threads not pinned"
        }
    );
    let mut s = Sealed::seal(&d.socket, &sim);
    let pool = s.register_pool(sim.pool_spec(1, 2 * PAGES));
    // memcpy baseline buffers (touched first so no page faults are timed).
    let src: Vec<u8> = (0..bytes)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761) as u8)
        .collect();
    let mut dst = vec![1u8; bytes];

    // Publish: rounds 1..=rounds each store new blocks.
    let (mut copied, mut durable, mut memcpy) = (Vec::new(), Vec::new(), Vec::new());
    for round in 1..=rounds as u32 {
        let pages: Vec<PageRef> = (0..PAGES)
            .map(|i| {
                let r = pool.reuse(i).unwrap();
                pool.write(i, 0, &src[i as usize * page_bytes..][..page_bytes])
                    .unwrap();
                r
            })
            .collect();
        let req = publish_request(&s, round, &pages);
        let t = Instant::now();
        let id = s.worker.send(&req).unwrap();
        let Message::PublishCopied { pages: st } = s.worker.reply(id).unwrap() else {
            panic!("no PublishCopied")
        };
        copied.push(t.elapsed().as_secs_f64());
        let Message::PublishDurable { pages: fin, .. } = s.worker.reply(id).unwrap() else {
            panic!("no PublishDurable")
        };
        durable.push(t.elapsed().as_secs_f64());
        assert!(
            st.iter()
                .chain(&fin)
                .all(|x| *x == orbitkv_protocol::PageStatus::Ok)
        );
        let t = Instant::now();
        dst.copy_from_slice(&src);
        memcpy.push(t.elapsed().as_secs_f64());
        std::hint::black_box(&dst);
    }
    // A second baseline: the same bytes as a Publish finds them — just written into the pool's
    // pages by the engine's thread (this one, CPU 0) — copied out by a thread on the daemon's
    // CPU (1): `memcpy` with the same cross-CPU cache traffic as the daemon's copy-out.
    let mut cross = Vec::new();
    let (pool_ref, src_ref) = (&pool, &src);
    let written = std::sync::Barrier::new(2);
    let copied_out = std::sync::Barrier::new(2);
    std::thread::scope(|sc| {
        let (written, copied_out, cross) = (&written, &copied_out, &mut cross);
        sc.spawn(move || {
            orbitkv_benches::pin_to(1);
            let mut out = vec![0u8; bytes];
            for _ in 0..rounds {
                written.wait();
                let t = Instant::now();
                for (i, chunk) in out.chunks_mut(page_bytes).enumerate() {
                    pool_ref.read(i as u32, 0, chunk).unwrap();
                }
                cross.push(t.elapsed().as_secs_f64());
                copied_out.wait();
            }
        });
        for _ in 0..rounds {
            for i in 0..PAGES {
                pool_ref
                    .write(i, 0, &src_ref[i as usize * page_bytes..][..page_bytes])
                    .unwrap();
            }
            written.wait();
            copied_out.wait();
        }
    });
    let (c, du, m) = (median(copied), median(durable), median(memcpy.clone()));
    let xc = median(cross);
    let served = daemon_mean(&(d.metrics)(), "publish_copied");
    let gb = |secs: f64| bytes as f64 / secs / 1e9;
    println!(
        "publish {PAGES} x {} KiB: until copied {:.2} GB/s, memcpy {:.2} GB/s; copied / memcpy = {:.3} (target >= 0.7); until durable {:.2} GB/s (stored and synced); memcpy out of the pages just written on the other CPU {:.2} GB/s (copied / that = {:.3}); the daemon's own time to PublishCopied {:.2} ms",
        page_bytes >> 10,
        gb(c),
        gb(m),
        m / c,
        gb(du),
        gb(xc),
        xc / c,
        served * 1e3
    );

    // Load: round 1's blocks, pinned under one lease, into pages PAGES..2*PAGES.
    let lease = match s
        .scheduler
        .request(&Message::Acquire(query(&s, 1, PAGES as usize)))
        .unwrap()
    {
        Message::Leased { lease, proof, .. } => {
            assert_eq!(proof.boundary, 16 * u64::from(PAGES));
            lease
        }
        other => panic!("{other:?}"),
    };
    let (mut loads, mut memcpy) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        let pages: Vec<LoadPage> = (0..PAGES)
            .map(|b| LoadPage {
                block: b,
                group: 0,
                rank: 0,
                page: pool.reuse(PAGES + b).unwrap(),
                layer_start: 0,
                layer_end: sim.layers,
            })
            .collect();
        let req = Message::Load(LoadRequest {
            token: s.worker_token,
            epoch: s.epoch,
            lease,
            pages,
        });
        let t = Instant::now();
        let Message::Loaded { pages: st } = s.worker.request(&req).unwrap() else {
            panic!("no Loaded")
        };
        loads.push(t.elapsed().as_secs_f64());
        assert!(st.iter().all(|x| *x == orbitkv_protocol::PageStatus::Ok));
        let t = Instant::now();
        dst.copy_from_slice(&src);
        memcpy.push(t.elapsed().as_secs_f64());
        std::hint::black_box(&dst);
    }
    // Every loaded byte is the published one.
    let mut got = vec![0u8; page_bytes];
    for b in 0..PAGES {
        pool.read(PAGES + b, 0, &mut got).unwrap();
        assert_eq!(got, src[b as usize * page_bytes..][..page_bytes]);
    }
    let (l, m) = (median(loads), median(memcpy));
    println!(
        "load {PAGES} x {} KiB (verified, from the DRAM tier): {:.2} GB/s, memcpy {:.2} GB/s; load / memcpy = {:.3} (target >= 0.7)",
        page_bytes >> 10,
        gb(l),
        gb(m),
        m / l
    );

    // Query round trips vs a raw echo of the same frames.
    let q = Message::Query(query(&s, 1, QUERY_BLOCKS));
    let reply = s.scheduler.request(&q).unwrap();
    assert!(matches!(&reply, Message::Proof(p) if p.boundary == 16 * QUERY_BLOCKS as u64));
    let echo_path = tmp.path().join("echo.sock");
    let listener = UnixListener::bind(&echo_path).unwrap();
    let echo_thread = echo(listener, reply.clone(), 1);
    let mut echo_client = Client::connect(&echo_path).unwrap();
    let (mut daemon_rtt, mut echo_rtt) = (Vec::new(), Vec::new());
    // Alternate in runs of 100 so both see the same machine.
    for _ in 0..rounds * queries.div_ceil(100) {
        for _ in 0..100 {
            let t = Instant::now();
            let r = s.scheduler.request(&q).unwrap();
            daemon_rtt.push(t.elapsed().as_secs_f64());
            std::hint::black_box(r);
        }
        for _ in 0..100 {
            let t = Instant::now();
            let r = echo_client.request(&q).unwrap();
            echo_rtt.push(t.elapsed().as_secs_f64());
            std::hint::black_box(r);
        }
    }
    drop(echo_client);
    // The daemon's own service time per query (decode to reply written), from its histogram.
    let service = daemon_mean(&(d.metrics)(), "query");

    // 64 Queries on one connection: pipelined (all sent, then the replies matched by request
    // id) vs one at a time, vs one round trip; rounds interleaved.
    const BURST: usize = 64;
    let (mut one, mut piped, mut sequential) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..rounds * 10 {
        let t = Instant::now();
        std::hint::black_box(s.scheduler.request(&q).unwrap());
        one.push(t.elapsed().as_secs_f64());
        let t = Instant::now();
        let ids: Vec<u64> = (0..BURST).map(|_| s.scheduler.send(&q).unwrap()).collect();
        for id in ids {
            assert!(matches!(s.scheduler.reply(id).unwrap(), Message::Proof(_)));
        }
        piped.push(t.elapsed().as_secs_f64());
        let t = Instant::now();
        for _ in 0..BURST {
            std::hint::black_box(s.scheduler.request(&q).unwrap());
        }
        sequential.push(t.elapsed().as_secs_f64());
    }
    let (o, p, sq) = (
        percentile(&mut one, 50.0),
        percentile(&mut piped, 50.0),
        percentile(&mut sequential, 50.0),
    );
    println!(
        "{BURST} queries on one connection, p50: pipelined {:.1} us, one at a time {:.1} us (pipelined / one at a time = {:.2}); one round trip {:.1} us (pipelined / one round trip = {:.2}); {BURST} x the daemon's mean service time {:.1} us (pipelined / that = {:.2})",
        p * 1e6,
        sq * 1e6,
        p / sq,
        o * 1e6,
        p / o,
        BURST as f64 * service * 1e6,
        p / (BURST as f64 * service)
    );
    let _ = echo_thread.join();
    let frame = q.encode_frame(1).unwrap().len();
    let reply_frame = reply.encode_frame(1).unwrap().len();
    let (d50, d99) = (
        percentile(&mut daemon_rtt, 50.0),
        percentile(&mut daemon_rtt, 99.0),
    );
    let (e50, e99) = (
        percentile(&mut echo_rtt, 50.0),
        percentile(&mut echo_rtt, 99.0),
    );
    println!(
        "query ({QUERY_BLOCKS} blocks proven; {frame}-byte request, {reply_frame}-byte reply): daemon p50 {:.1} us p99 {:.1} us (mean service in the daemon {:.1} us), echo p50 {:.1} us p99 {:.1} us; daemon / echo = {:.2} at p50, {:.2} at p99 (target <= 2)",
        d50 * 1e6,
        d99 * 1e6,
        service * 1e6,
        e50 * 1e6,
        e99 * 1e6,
        d50 / e50,
        d99 / e99
    );
}
