//! The daemon and simulated engines as real processes.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// A running `orbitkv serve`.
pub struct Serve {
    pub child: Child,
    pub socket: PathBuf,
    /// host:port of the metrics exporter.
    pub metrics: String,
    /// The document serve printed when it started listening.
    pub info: serde_json::Value,
}

/// The `orbitkv` binary under test.
pub fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_orbitkv"))
}

impl Serve {
    /// Starts `orbitkv serve` on `data` (64 MiB DRAM, 1 GiB SSD) and waits until it says where
    /// it listens.
    pub fn start(data: &Path) -> Self {
        let child = bin()
            .args(["serve", "--json", "--data-dir"])
            .arg(data)
            .args(["--dram-bytes", "64MiB", "--ssd-bytes", "1GiB"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("spawn: {e}"));
        Self::attach(child)
    }

    /// Takes over a `serve --json` child: reads the document it prints once it listens.
    pub fn attach(mut child: Child) -> Self {
        let stdout = child.stdout.take().unwrap_or_else(|| panic!("no stdout"));
        let mut line = String::new();
        // The daemon keeps stdout open: read its one line only.
        let _ = BufReader::new(stdout).read_line(&mut line);
        let info: serde_json::Value = serde_json::from_str(&line).unwrap_or_else(|e| {
            let mut err = String::new();
            if let Some(mut s) = child.stderr.take() {
                let _ = s.read_to_string(&mut err);
            }
            panic!("serve printed {line:?} ({e}); stderr: {err}")
        });
        let text = |k: &str| {
            info[k]
                .as_str()
                .unwrap_or_else(|| panic!("no {k} in {info}"))
                .to_owned()
        };
        let metrics = text("metrics");
        let metrics = metrics
            .strip_prefix("http://")
            .and_then(|m| m.strip_suffix("/metrics"))
            .unwrap_or_else(|| panic!("metrics address {metrics}"))
            .to_owned();
        Serve {
            socket: PathBuf::from(text("socket")),
            metrics,
            info,
            child,
        }
    }

    /// The metrics text, scraped over HTTP.
    pub fn scrape(&self) -> String {
        scrape(&self.metrics)
    }

    /// The value of metric line `name` (a full name, labels included).
    pub fn metric(&self, name: &str) -> u64 {
        metric(&self.scrape(), name)
    }

    /// Runs `orbitkv engine-sim --json` against this daemon with `args`; returns its exit code
    /// and report.
    pub fn engine_sim(&self, args: &[&str]) -> (Option<i32>, serde_json::Value) {
        let out = bin()
            .args(["engine-sim", "--json", "--socket"])
            .arg(&self.socket)
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("{e}"));
        (out.status.code(), report(&out))
    }

    /// Waits until `cond` holds on the metrics text (20 s at most).
    pub fn wait_for(&self, what: &str, cond: impl Fn(&str) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let text = self.scrape();
            if cond(&text) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}:\n{text}"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Stops it with SIGTERM and returns its exit status and stderr.
    pub fn stop(mut self) -> (std::process::ExitStatus, String) {
        signal(&self.child, libc::SIGTERM);
        let status = wait(&mut self.child, Duration::from_secs(20));
        let mut stderr = String::new();
        if let Some(mut e) = self.child.stderr.take() {
            let _ = e.read_to_string(&mut stderr);
        }
        (status, stderr)
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The single JSON document a command printed.
pub fn report(out: &Output) -> serde_json::Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "not one JSON document ({e}): {}\nstderr: {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// Waits for `child` to exit (`limit` at most).
pub fn wait(child: &mut Child, limit: Duration) -> std::process::ExitStatus {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(s) = child.try_wait().unwrap_or_else(|e| panic!("{e}")) {
            return s;
        }
        assert!(Instant::now() < deadline, "the process did not exit");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// `GET /metrics` from `addr`.
pub fn scrape(addr: &str) -> String {
    let mut s = std::net::TcpStream::connect(addr).unwrap_or_else(|e| panic!("{e}"));
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap_or_else(|e| panic!("{e}"));
    let mut body = String::new();
    s.read_to_string(&mut body)
        .unwrap_or_else(|e| panic!("{e}"));
    body
}

/// The value of metric line `name` in `text` (0 when absent).
pub fn metric(text: &str, name: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or(0)
}

/// Sends `sig` to `child`.
#[expect(unsafe_code, reason = "sending a signal has no safe wrapper in std")]
pub fn signal(child: &Child, sig: libc::c_int) {
    let pid = libc::pid_t::try_from(child.id()).unwrap_or_else(|e| panic!("{e}"));
    // SAFETY: kill only sends a signal to the child we spawned.
    unsafe {
        libc::kill(pid, sig);
    }
}

/// A copy of the repository's tiny model with a tokenizer file beside it, in `dir`.
pub fn model_copy(dir: &Path) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/tiny-model");
    std::fs::create_dir_all(dir).unwrap_or_else(|e| panic!("{e}"));
    for e in std::fs::read_dir(&src).unwrap_or_else(|e| panic!("{e}")) {
        let e = e.unwrap_or_else(|e| panic!("{e}"));
        std::fs::copy(e.path(), dir.join(e.file_name())).unwrap_or_else(|e| panic!("{e}"));
    }
    std::fs::write(
        dir.join("tokenizer.json"),
        br#"{"version":"1.0","model":{"type":"BPE","vocab":{"a":0,"b":1}}}"#,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    dir.to_owned()
}

/// The repository's copy of the published Mooncake trace.
pub fn trace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/traces/mooncake_synthetic_trace.jsonl")
}
