//! The control socket with real connections: hello, the seal across connections, refusals,
//! admin requests, and bad input — truncated frames, wrong versions, huge lengths, unknown
//! types, garbage — from several clients: each gets an error or a disconnect, the daemon stays
//! up, and other clients are unaffected.

mod common;

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use common::{Daemon, registration, store};
use orbitkv_manager::server::{ServeError, Server, ServerConfig};
use orbitkv_protocol::client::{Client, ClientError};
use orbitkv_protocol::{ErrorCode, Message, Role};

/// Registers the scheduler and `workers` workers of `instance`, each from its own thread and
/// connection; returns every rank's reply.
fn seal_round(
    socket: &Path,
    instance: &str,
    workers: u32,
    change: fn(&mut orbitkv_protocol::message::Register),
) -> Vec<Result<Message, ClientError>> {
    let mut ranks = vec![(Role::Scheduler, 0)];
    ranks.extend((0..workers).map(|r| (Role::Worker, r)));
    let threads: Vec<_> = ranks
        .into_iter()
        .enumerate()
        .map(|(i, (role, rank))| {
            let socket = socket.to_owned();
            let instance = instance.to_owned();
            std::thread::spawn(move || {
                let mut c = Client::connect(&socket).unwrap_or_else(|e| panic!("{e}"));
                let mut reg = registration(&instance, role, rank, workers);
                if i == 1 {
                    change(&mut reg);
                }
                c.request(&Message::Register(reg))
            })
        })
        .collect();
    threads
        .into_iter()
        .map(|t| t.join().unwrap_or_else(|_| panic!("rank thread panicked")))
        .collect()
}

#[test]
fn ranks_on_separate_connections_seal_together() {
    let d = Daemon::start();
    let mode = std::fs::metadata(&d.socket)
        .unwrap_or_else(|e| panic!("{e}"))
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o660, "socket mode");
    let replies = seal_round(&d.socket, "engine-a", 2, |_| {});
    let mut epochs = Vec::new();
    for r in replies {
        match r {
            Ok(Message::Sealed { epoch, .. }) => epochs.push(epoch),
            other => panic!("not sealed: {other:?}"),
        }
    }
    assert_eq!(epochs.len(), 3);
    assert!(epochs.iter().all(|e| *e == epochs[0]));
    let stats = d.client().stats().unwrap_or_else(|e| panic!("{e}"));
    assert!(stats.contains("orbitkv_seals_total 3"), "{stats}");
    // The namespace is registered in the store (sync reaches it).
    assert!(matches!(
        d.client().request(&Message::Sync),
        Ok(Message::Synced)
    ));
}

#[test]
fn a_disagreeing_rank_refuses_the_seal_for_all_with_the_field_named() {
    let d = Daemon::start();
    let replies = seal_round(&d.socket, "engine-b", 2, |r| r.identity[3] ^= 0xff);
    assert_eq!(replies.len(), 3);
    for r in replies {
        match r {
            Err(ClientError::Refused { code, detail, .. }) => {
                assert_eq!(code, ErrorCode::SealRefused);
                assert!(detail.contains("computation identity"), "{detail}");
            }
            other => panic!("not refused: {other:?}"),
        }
    }
}

#[test]
fn a_missing_rank_times_the_seal_out() {
    let d = Daemon::start();
    let mut c = d.client();
    let mut reg = registration("engine-c", Role::Scheduler, 0, 1);
    reg.seal_timeout_ms = 100;
    match c.request(&Message::Register(reg)) {
        Err(ClientError::Refused { code, detail, .. }) => {
            assert_eq!(code, ErrorCode::SealTimeout);
            assert!(detail.contains("worker 0"), "{detail}");
        }
        other => panic!("no timeout: {other:?}"),
    }
}

#[test]
fn bad_input_gets_an_error_or_a_disconnect_and_others_carry_on() {
    let d = Daemon::start();
    let good = Message::Sync
        .encode_frame(1)
        .unwrap_or_else(|e| panic!("{e}"));
    let mut wrong_version = good.clone();
    wrong_version[4] = 9;
    let mut unknown_type = good.clone();
    unknown_type[6..8].copy_from_slice(&0x0777u16.to_le_bytes());
    let mut huge = good.clone();
    huge[16..20].copy_from_slice(&u32::MAX.to_le_bytes());
    let reply_as_request = Message::Synced
        .encode_frame(1)
        .unwrap_or_else(|e| panic!("{e}"));
    let inputs: Vec<Vec<u8>> = vec![
        good[..10].to_vec(),
        // A frame that stops halfway and never goes on: refused after the frame timeout.
        good[..12].to_vec(),
        wrong_version,
        unknown_type,
        huge,
        reply_as_request,
        b"GET / HTTP/1.1\r\n\r\n".to_vec(),
        (0..4096u32).map(|i| (i * 31 % 251) as u8).collect(),
    ];
    let threads: Vec<_> = inputs
        .into_iter()
        .enumerate()
        .map(|(i, bytes)| {
            let socket = d.socket.clone();
            std::thread::spawn(move || {
                let mut s = std::os::unix::net::UnixStream::connect(&socket)
                    .unwrap_or_else(|e| panic!("{e}"));
                s.set_read_timeout(Some(std::time::Duration::from_secs(10)))
                    .unwrap_or_else(|e| panic!("{e}"));
                let _ = s.write_all(&bytes);
                if i == 0 {
                    // A truncated frame: the daemon waits for the rest; hanging up ends it.
                    let _ = s.shutdown(std::net::Shutdown::Write);
                }
                let mut back = Vec::new();
                match s.read_to_end(&mut back) {
                    Ok(_) => {}
                    // Closed with some of the garbage unread: a reset, after the error reply.
                    Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
                    Err(e) => panic!("input {i}: no disconnect: {e} (got {back:?})"),
                }
                back
            })
        })
        .collect();
    for (i, t) in threads.into_iter().enumerate() {
        let back = t
            .join()
            .unwrap_or_else(|_| panic!("client thread panicked"));
        if i == 0 {
            continue;
        }
        // An Error frame (then the close).
        assert!(
            back.len() >= 24 && &back[..4] == b"OKVM",
            "input {i}: {back:?}"
        );
        assert_eq!(u16::from_le_bytes([back[6], back[7]]), 0x02ff, "input {i}");
    }
    // The daemon still serves.
    let mut c = d.client();
    assert!(matches!(c.request(&Message::Sync), Ok(Message::Synced)));
    let stats = c.stats().unwrap_or_else(|e| panic!("{e}"));
    assert!(
        stats.contains("orbitkv_malformed_messages_total 7"),
        "{stats}"
    );
}

#[test]
fn socket_paths_are_checked_and_a_second_daemon_is_refused() {
    let d = Daemon::start();
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let again = Server::bind(ServerConfig::new(&d.socket), store(&dir.path().join("x")));
    assert!(matches!(again, Err(ServeError::AlreadyServing(_))));
    // A file that is not a socket is never replaced.
    let plain = dir.path().join("plain");
    std::fs::write(&plain, b"keep me").unwrap_or_else(|e| panic!("{e}"));
    assert!(Server::bind(ServerConfig::new(&plain), store(&dir.path().join("z"))).is_err());
    assert_eq!(std::fs::read(&plain).unwrap_or_default(), b"keep me");
    let long = dir.path().join("s".repeat(120));
    let r = Server::bind(ServerConfig::new(&long), store(&dir.path().join("y")));
    match r {
        Err(e @ ServeError::SocketPathTooLong { .. }) => {
            assert!(e.to_string().contains("at most 107"), "{e}");
        }
        Err(other) => panic!("{other}"),
        Ok(_) => panic!("a 120-byte socket path was accepted"),
    }
}
