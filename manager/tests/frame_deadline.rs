//! A frame has a deadline once its first byte has arrived, through the socket: a client
//! dripping a frame a byte at a time (each byte well inside the frame timeout) is answered
//! "frame incomplete" and disconnected once the frame's time is up — it cannot hold a thread
//! and a body buffer for ever — while idle time between frames stays unlimited.

mod common;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use common::Daemon;
use orbitkv_protocol::{DEFAULT_MAX_BODY, ErrorCode, Message, read_frame};

#[test]
fn a_frame_dripped_a_byte_at_a_time_is_cut_off_at_its_deadline() {
    let d = Daemon::start_with(|c| c.frame_timeout = Duration::from_millis(300));
    let mut s = UnixStream::connect(&d.socket).unwrap_or_else(|e| panic!("{e}"));
    let frame = Message::Stats
        .encode_frame(1)
        .unwrap_or_else(|e| panic!("{e}"));
    let t = Instant::now();
    let mut sent = 0;
    // A byte every 100 ms: each read is well within the 300 ms timeout.
    for b in &frame {
        if s.write_all(&[*b]).is_err() || t.elapsed() > Duration::from_secs(3) {
            break;
        }
        sent += 1;
        std::thread::sleep(Duration::from_millis(100));
        if sent == frame.len() {
            break;
        }
    }
    s.set_read_timeout(Some(Duration::from_secs(3)))
        .unwrap_or_else(|e| panic!("{e}"));
    match read_frame(&mut s, DEFAULT_MAX_BODY) {
        Ok((h, body)) => {
            let m = Message::decode(h.kind, &body).unwrap_or_else(|e| panic!("{e}"));
            match m {
                Message::Error { code, detail, .. } => {
                    assert_eq!(code, ErrorCode::Malformed);
                    assert!(detail.contains("incomplete"), "{detail}");
                }
                other => panic!("{other:?}"),
            }
        }
        Err(e) => panic!("no refusal: {e}"),
    }
    // Cut off near the deadline: a few bytes in, not the whole frame.
    assert!(sent < frame.len(), "the whole dripped frame was taken");
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    let mut rest = Vec::new();
    let _ = s.read_to_end(&mut rest);
    assert!(rest.is_empty(), "the connection stayed open");
}

#[test]
fn idle_time_between_frames_is_unlimited() {
    let d = Daemon::start_with(|c| c.frame_timeout = Duration::from_millis(100));
    let mut c = d.client();
    std::thread::sleep(Duration::from_millis(600));
    c.stats().unwrap_or_else(|e| panic!("{e}"));
    std::thread::sleep(Duration::from_millis(600));
    c.stats().unwrap_or_else(|e| panic!("{e}"));
}
