//! `orbitkv serve` as a real process: it prints where it listens, seals an instance whose ranks
//! connect from separate threads, serves metrics over HTTP, answers `orbitkv admin` (stats, sync,
//! retire), refuses a second daemon on the same data directory, and on SIGTERM stops cleanly — exit 0, socket removed, store lock released
//! (the namespace it registered is there for `inspect`).

mod common;

use std::process::Command;

use common::daemon::Serve;
use orbitkv_protocol::client::Client;
use orbitkv_protocol::{Message, Role};
use orbitkv_sim::SimInstance;

#[test]
fn serve_seals_serves_metrics_and_stops_cleanly_on_sigterm() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let data = dir.path().join("orbitkv-data");
    let serve = Serve::start(&data);
    assert_eq!(
        serve.socket,
        data.join("orbitkv.sock"),
        "the default socket"
    );
    // A two-worker instance: three connections, one per rank.
    let sim = SimInstance::new("engine-a", 2);
    let ranks = [(Role::Scheduler, 0), (Role::Worker, 0), (Role::Worker, 1)];
    let threads: Vec<_> = ranks
        .into_iter()
        .map(|(role, rank)| {
            let (socket, sim) = (serve.socket.clone(), sim.clone());
            std::thread::spawn(move || {
                let mut c = Client::connect(&socket).unwrap_or_else(|e| panic!("{e}"));
                c.hello("cli-serve-test").unwrap_or_else(|e| panic!("{e}"));
                let reg = sim
                    .registration(role, rank)
                    .unwrap_or_else(|e| panic!("{e}"));
                c.request(&Message::Register(reg))
            })
        })
        .collect();
    let mut namespace = None;
    for t in threads {
        let r = t.join().unwrap_or_else(|_| panic!("rank thread panicked"));
        match r {
            Ok(Message::Sealed { namespace: ns, .. }) => namespace = Some(ns),
            other => panic!("{other:?}"),
        }
    }
    let namespace = orbitkv_state::hex::encode(&namespace.unwrap_or_else(|| panic!("no seal")));
    // `orbitkv admin` against the running daemon.
    let admin = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_orbitkv"))
            .arg("admin")
            .args(args)
            .arg("--socket")
            .arg(&serve.socket)
            .output()
            .unwrap_or_else(|e| panic!("{e}"))
    };
    let stats = admin(&["stats", "--json"]);
    assert!(
        stats.status.success(),
        "{}",
        String::from_utf8_lossy(&stats.stderr)
    );
    let doc: serde_json::Value =
        serde_json::from_slice(&stats.stdout).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(doc["orbitkv_seals_total"], 3, "{doc}");
    let sync = admin(&["sync"]);
    assert_eq!(String::from_utf8_lossy(&sync.stdout), "synced\n");
    let unknown = admin(&["retire", "--namespace", &"ab".repeat(32)]);
    assert_eq!(unknown.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("not registered"));
    let retire = admin(&["retire", "--json", "--namespace", &namespace]);
    assert!(
        retire.status.success(),
        "{}",
        String::from_utf8_lossy(&retire.stderr)
    );
    let doc: serde_json::Value =
        serde_json::from_slice(&retire.stdout).unwrap_or_else(|e| panic!("{e}"));
    assert!(doc["watermark"].as_u64().is_some_and(|w| w > 0), "{doc}");
    let text = serve.scrape();
    assert!(text.starts_with("HTTP/1.1 200 OK"), "{text}");
    assert!(text.contains("orbitkv_seals_total 3"), "{text}");
    // A second daemon on the same data directory is refused with a clear message.
    let second = Command::new(env!("CARGO_BIN_EXE_orbitkv"))
        .args(["serve", "--data-dir"])
        .arg(&data)
        .args(["--ssd-bytes", "1GiB", "--socket"])
        .arg(dir.path().join("other.sock"))
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(second.status.code(), Some(2));
    let err = String::from_utf8_lossy(&second.stderr);
    assert!(err.contains("orbitkv: "), "{err}");
    // SIGTERM: a clean stop.
    let socket = serve.socket.clone();
    let (status, stderr) = serve.stop();
    assert!(status.success(), "exit {status}: {stderr}");
    assert!(!socket.exists(), "the socket file was left behind");
    // The lock is released and the namespace the seal registered is in the store.
    let inspect = Command::new(env!("CARGO_BIN_EXE_orbitkv"))
        .args(["inspect", "--json", "--data-dir"])
        .arg(&data)
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        inspect.status.success(),
        "{}",
        String::from_utf8_lossy(&inspect.stderr)
    );
    let out = String::from_utf8_lossy(&inspect.stdout);
    assert!(out.contains("sim/dense-2l"), "{out}");
}

#[test]
fn admin_without_a_daemon_says_so() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let out = Command::new(env!("CARGO_BIN_EXE_orbitkv"))
        .args(["admin", "sync", "--socket"])
        .arg(dir.path().join("none.sock"))
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cannot reach a daemon"), "{err}");
}

#[test]
fn a_socket_path_over_the_limit_is_refused_with_a_clear_message() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let out = Command::new(env!("CARGO_BIN_EXE_orbitkv"))
        .args(["serve", "--ssd-bytes", "1GiB", "--data-dir"])
        .arg(dir.path().join("d"))
        .arg("--socket")
        .arg(dir.path().join("s".repeat(120)))
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("at most 107"), "{err}");
}

#[test]
fn serve_reads_its_configuration_file_and_flags_override_it() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let conf = dir.path().join("orbitkv.toml");
    let from_file = dir.path().join("from-file");
    std::fs::write(
        &conf,
        format!(
            "data_dir = {:?}\nsocket = {:?}\n[capacity]\nssd_bytes = \"1GiB\"\ndram_bytes = \"32MiB\"\n[limits]\nmax_pins_per_client = 2\n",
            from_file.display().to_string(),
            dir.path().join("file.sock").display().to_string()
        ),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let out = Command::new(env!("CARGO_BIN_EXE_orbitkv"))
        .args(["serve", "--json", "--config"])
        .arg(&conf)
        .arg("--socket")
        .arg(dir.path().join("flag.sock"))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{e}"));
    let serve = Serve::attach(out);
    // The file's data directory and budgets; the flag's socket.
    assert_eq!(serve.socket, dir.path().join("flag.sock"));
    assert_eq!(serve.info["data_dir"], from_file.display().to_string());
    assert_eq!(serve.info["ssd_bytes"], 1u64 << 30);
    assert_eq!(serve.info["dram_bytes"], 32u64 << 20);
    // Adaptive admission by default, its waiting room half the DRAM budget here (a tenth of the
    // SSD budget would be more).
    assert_eq!(serve.info["admission"], "adaptive");
    assert_eq!(serve.info["waiting_bytes"], 16u64 << 20);
    // The file's pin limit (2): a consumer acquiring the publisher's blocks (more than two) is
    // refused.
    let (code, first) = serve.engine_sim(&["--requests", "1", "--seed", "1"]);
    assert_eq!(code, Some(0), "{first}");
    assert!(
        first["published_pages"].as_u64().is_some_and(|n| n > 2),
        "{first}"
    );
    let (code, _) = serve.engine_sim(&["--requests", "1", "--seed", "1", "--consumer"]);
    assert_eq!(code, Some(1), "refused past the pin limit");
    let (status, stderr) = serve.stop();
    assert!(status.success(), "{stderr}");
    // An unknown key is refused with its name.
    std::fs::write(&conf, "data_dri = \"x\"\n").unwrap_or_else(|e| panic!("{e}"));
    let bad = Command::new(env!("CARGO_BIN_EXE_orbitkv"))
        .args(["serve", "--config"])
        .arg(&conf)
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(bad.status.code(), Some(2));
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(err.contains("data_dri"), "{err}");
}
