//! Which transport the hot path should use: the round trip of a request of a Query's size (1,148
//! bytes) answered by a reply of a Proof's size (176 bytes) over a Unix stream socket (blocking
//! reads, as the daemon serves) against iceoryx2 request-response in shared memory, both with
//! event notification (each side blocks on an iceoryx2 listener until the other notifies: what
//! a daemon serving many engines can afford) and busy-polling (each side spins: a core per
//! client on the daemon's side). With two CPUs or more the blocking variants run servers on CPU
//! 1 and clients on CPU 0 (the hot-path bench's placement); the busy-polling pair runs unpinned
//! (pinned, two spinning threads stalled ~8 ms per round trip on a 2-vCPU virtual machine).
//! Interleaved rounds.
//!
//! Run: `cargo bench -p orbitkv-benches --bench transport` (environment: `ORBITKV_BENCH_ROUNDS`,
//! default 3; `ORBITKV_BENCH_QUERIES` round trips per transport and round, default 20000). Not
//! a CI gate: docs/performance.md records the results and the choice they made.

#![expect(
    clippy::unwrap_used,
    reason = "a benchmark harness: a failed setup step ends the run"
)]

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::time::Instant;

use iceoryx2::prelude::*;

const REQ: usize = 1148;
const RESP: usize = 176;

/// The `p`-th percentile of `v` in microseconds (nearest rank).
fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[(((p / 100.0) * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1] * 1e6
}

/// Round trips over a Unix stream socket pair, blocking reads on both sides.
fn socket(n: usize) -> Vec<f64> {
    let (mut a, mut b) = UnixStream::pair().unwrap();
    let t = std::thread::spawn(move || {
        orbitkv_benches::pin_to(1);
        let mut req = [0u8; REQ];
        let resp = [1u8; RESP];
        while b.read_exact(&mut req).is_ok() {
            if b.write_all(&resp).is_err() {
                break;
            }
        }
    });
    let req = [2u8; REQ];
    let mut resp = [0u8; RESP];
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        let s = Instant::now();
        a.write_all(&req).unwrap();
        a.read_exact(&mut resp).unwrap();
        v.push(s.elapsed().as_secs_f64());
    }
    drop(a);
    t.join().unwrap();
    v
}

type Rr = iceoryx2::service::port_factory::request_response::PortFactory<
    ipc::Service,
    [u8; REQ],
    (),
    [u8; RESP],
    (),
>;
type Ev = iceoryx2::service::port_factory::event::PortFactory<ipc::Service>;

/// The request-response service `name` and its two event services (requests waiting for the
/// server, responses waiting for the client).
fn services(node: &Node<ipc::Service>, name: &str) -> (Rr, Ev, Ev) {
    let rr = node
        .service_builder(&name.try_into().unwrap())
        .request_response::<[u8; REQ], [u8; RESP]>()
        .open_or_create()
        .unwrap();
    let event = |suffix: &str| {
        node.service_builder(&format!("{name}/{suffix}").as_str().try_into().unwrap())
            .event()
            .open_or_create()
            .unwrap()
    };
    (rr, event("req"), event("resp"))
}

/// Round trips over iceoryx2 request-response, waiting on events (`events`) or spinning.
fn ix(n: usize, events: bool, tag: &str) -> Vec<f64> {
    let name = format!("okv/bench/{tag}/{}", std::process::id());
    let srv_name = name.clone();
    let ready = std::sync::Arc::new(std::sync::Barrier::new(2));
    let r2 = ready.clone();
    let t = std::thread::spawn(move || {
        if events {
            orbitkv_benches::pin_to(1);
        } else {
            orbitkv_benches::unpin();
        }
        let node = NodeBuilder::new().create::<ipc::Service>().unwrap();
        let (svc, to_server, to_client) = services(&node, &srv_name);
        let server = svc.server_builder().create().unwrap();
        let listener = to_server.listener_builder().create().unwrap();
        let notifier = to_client.notifier_builder().create().unwrap();
        r2.wait();
        let mut served = 0;
        while served < n {
            if events {
                listener.blocking_wait(|_| {}).unwrap();
            }
            while let Some(active) = server.receive().unwrap() {
                active.send_copy([1u8; RESP]).unwrap();
                served += 1;
                if events {
                    notifier.notify().unwrap();
                }
            }
            if !events {
                std::hint::spin_loop();
            }
        }
    });
    if !events {
        orbitkv_benches::unpin();
    }
    let node = NodeBuilder::new().create::<ipc::Service>().unwrap();
    let (svc, to_server, to_client) = services(&node, &name);
    let client = svc.client_builder().create().unwrap();
    let notifier = to_server.notifier_builder().create().unwrap();
    let listener = to_client.listener_builder().create().unwrap();
    ready.wait();
    std::thread::sleep(std::time::Duration::from_millis(100));
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        let s = Instant::now();
        let pending = client.send_copy([2u8; REQ]).unwrap();
        if events {
            notifier.notify().unwrap();
        }
        loop {
            if let Some(r) = pending.receive().unwrap() {
                std::hint::black_box(&*r);
                break;
            }
            if events {
                listener.blocking_wait(|_| {}).unwrap();
            } else {
                std::hint::spin_loop();
            }
        }
        v.push(s.elapsed().as_secs_f64());
    }
    t.join().unwrap();
    if !events {
        orbitkv_benches::pin_to(0);
    }
    v
}

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let rounds = env_usize("ORBITKV_BENCH_ROUNDS", 3).max(1);
    let n = env_usize("ORBITKV_BENCH_QUERIES", 20_000).max(1);
    let pinned = orbitkv_benches::pin_to(0);
    println!(
        "transport bench: {rounds} rounds of {n} round trips per transport; {}",
        if pinned {
            "servers on CPU 1, clients on CPU 0"
        } else {
            "threads not pinned"
        }
    );
    for round in 0..rounds {
        let mut s = socket(n);
        let mut e = ix(n, true, &format!("ev{round}"));
        let mut p = ix(n, false, &format!("poll{round}"));
        println!(
            "round {round}: socket p50 {:.1} us p99 {:.1} us | iceoryx2 with events p50 {:.1} us p99 {:.1} us | iceoryx2 busy-polling p50 {:.1} us p99 {:.1} us",
            pct(&mut s, 50.0),
            pct(&mut s, 99.0),
            pct(&mut e, 50.0),
            pct(&mut e, 99.0),
            pct(&mut p, 50.0),
            pct(&mut p, 99.0)
        );
    }
}
