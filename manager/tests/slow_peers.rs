//! No peer can hold the daemon, through the socket: a client that never reads its replies is
//! disconnected once they pile up (and its leases end), while every other client — a rank
//! waiting for its seal among them — is answered at once; and the daemon stops within 5 s
//! whatever its peers do (one that never reads, one dripping a frame, one idle).

mod common;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use common::{Daemon, registration};
use orbitkv_protocol::client::Client;
use orbitkv_protocol::{Message, Role};

/// Sends `n` Stats requests on `s` without reading a reply; returns how many were written
/// before the daemon closed the connection (or all `n`).
fn flood_stats(s: &mut UnixStream, n: usize) -> usize {
    let frame = Message::Stats
        .encode_frame(9)
        .unwrap_or_else(|e| panic!("{e}"));
    s.set_write_timeout(Some(Duration::from_secs(2)))
        .unwrap_or_else(|e| panic!("{e}"));
    for i in 0..n {
        if s.write_all(&frame).is_err() {
            return i;
        }
    }
    n
}

#[test]
fn a_client_that_never_reads_is_disconnected_and_delays_nobody() {
    let d = Daemon::start_with(|c| c.max_body = 1 << 20);
    let mut hog = UnixStream::connect(&d.socket).unwrap_or_else(|e| panic!("{e}"));
    let t = Instant::now();
    let written = flood_stats(&mut hog, 20_000);
    // Another client is served at once, while and after the hog floods.
    let mut other = d.client();
    let asked = Instant::now();
    other.stats().unwrap_or_else(|e| panic!("{e}"));
    assert!(
        asked.elapsed() < Duration::from_secs(1),
        "{:?}",
        asked.elapsed()
    );
    // The hog's replies piled up past their bound: it was disconnected (its socket reads the
    // end after what was sent), long before all of its requests were answered.
    hog.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap_or_else(|e| panic!("{e}"));
    let mut sink = Vec::new();
    let _ = hog.read_to_end(&mut sink);
    let answered = sink.len() / 1000;
    assert!(
        written < 20_000 || answered < written,
        "{written} written, about {answered} KB of replies"
    );
    assert!(t.elapsed() < Duration::from_secs(30));
    // Counted once its connection's threads have cleaned up after it.
    let mut stats = String::new();
    for _ in 0..200 {
        stats = other.stats().unwrap_or_else(|e| panic!("{e}"));
        if stats.contains("orbitkv_slow_peers_total 1\n") {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(stats.contains("orbitkv_slow_peers_total 1\n"), "{stats}");
}

#[test]
fn a_rank_that_never_reads_does_not_delay_its_instances_seal() {
    let d = Daemon::start_with(|c| c.max_body = 4 << 20);
    // The scheduler registers, then floods Stats without reading: its socket fills and its
    // replies queue (below their bound, so it stays connected).
    let mut scheduler = UnixStream::connect(&d.socket).unwrap_or_else(|e| panic!("{e}"));
    let reg = Message::Register(registration("quiet", Role::Scheduler, 0, 1));
    scheduler
        .write_all(&reg.encode_frame(1).unwrap_or_else(|e| panic!("{e}")))
        .unwrap_or_else(|e| panic!("{e}"));
    flood_stats(&mut scheduler, 100);
    std::thread::sleep(Duration::from_millis(200));
    // The worker's registration seals the instance: its own reply comes at once.
    let mut worker = Client::connect(&d.socket).unwrap_or_else(|e| panic!("{e}"));
    let t = Instant::now();
    let m = worker
        .request(&Message::Register(registration(
            "quiet",
            Role::Worker,
            0,
            1,
        )))
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(matches!(m, Message::Sealed { .. }), "{m:?}");
    assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
}

#[test]
fn the_daemon_stops_within_5_s_whatever_its_peers_do() {
    let d = Daemon::start_with(|c| {
        c.max_body = 4 << 20;
        c.frame_timeout = Duration::from_secs(30);
        c.send_timeout = Duration::from_secs(30);
    });
    // One never reads (replies queued, socket full); one drips a frame a byte at a time; one
    // idles between frames.
    let mut hog = UnixStream::connect(&d.socket).unwrap_or_else(|e| panic!("{e}"));
    flood_stats(&mut hog, 300);
    let mut drip = UnixStream::connect(&d.socket).unwrap_or_else(|e| panic!("{e}"));
    drip.write_all(b"OKVM").unwrap_or_else(|e| panic!("{e}"));
    let _idle = d.client();
    std::thread::sleep(Duration::from_millis(200));
    let t = Instant::now();
    drop(d);
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
}
