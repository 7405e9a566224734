//! The daemon under test: `orbitkv serve` as a child process at debug level, its stderr read
//! line by line for the store's phase markers (`phase="seal" step="begin" segment=12`), killed
//! with SIGKILL by the harness or, armed for a phase, by the log reader the moment that phase
//! begins.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The store's phases, as their markers name them (salvage counts as compaction).
pub const PHASES: [&str; 4] = ["seal", "compact", "reclaim", "retire"];
/// [`PHASES`] index of sealing.
pub const SEAL: usize = 0;
/// [`PHASES`] index of compaction.
pub const COMPACT: usize = 1;
/// [`PHASES`] index of reclaim.
pub const RECLAIM: usize = 2;
/// [`PHASES`] index of retirement.
pub const RETIRE: usize = 3;

/// Warnings kept word for word in the report.
const KEPT_WARNINGS: usize = 8;

/// How to start the daemon.
#[derive(Debug, Clone)]
pub struct DaemonOptions {
    /// The `orbitkv` binary.
    pub exe: PathBuf,
    /// The data directory.
    pub data_dir: PathBuf,
    /// The SSD budget.
    pub ssd_bytes: u64,
    /// The segment size.
    pub segment_bytes: u64,
    /// How often it compacts.
    pub compact_interval: Duration,
    /// Below which live fraction it compacts.
    pub compact_threshold: f64,
    /// Its SSD policy.
    pub policy: orbitkv_store::Policy,
    /// Its SSD admission waiting room (0: admission off); the DRAM tier holds nothing else.
    pub waiting_bytes: u64,
}

/// What the harness is doing, seen by whoever kills the daemon.
#[derive(Debug, Default)]
pub struct Activity {
    /// Publishes sent and not yet answered durable (or failed).
    pub publishing: AtomicI64,
    /// A Retire has been sent and not answered.
    pub retiring: AtomicBool,
}

/// The state at the moment of the kill, seen from the harness.
#[derive(Debug, Clone, Copy)]
pub struct KillSnapshot {
    /// When the signal was sent.
    pub at: Instant,
    /// A Publish was outstanding.
    pub publishing: bool,
    /// A Retire was outstanding.
    pub retiring: bool,
}

/// What the daemon's log said.
#[derive(Debug, Clone, Default)]
pub struct LogState {
    /// Per phase: its last `begin` has no `end` (yet).
    pub open: [bool; 4],
    /// Per phase: `begin` markers seen (compactions only when they had segments to consider).
    pub begins: [u64; 4],
    /// Per phase: `end` markers seen.
    pub ends: [u64; 4],
    /// Compactions that rewrote at least one segment.
    pub compactions: u64,
    /// Segments those compactions rewrote.
    pub compacted_segments: u64,
    /// Segments whose reclaim began.
    pub reclaimed: Vec<u64>,
    /// New segments written over a reclaimed segment's file.
    pub recycled: u64,
    /// Warning and error lines.
    pub warnings: u64,
    /// The first few of them.
    pub first_warnings: Vec<String>,
}

/// Kills the daemon once, noting what was in flight.
pub struct Killer {
    child: Mutex<Child>,
    activity: Arc<Activity>,
    snapshot: Mutex<Option<KillSnapshot>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Killer {
    /// Sends SIGKILL (the first call only); returns what was in flight then.
    pub fn kill(&self) -> KillSnapshot {
        let mut snap = lock(&self.snapshot);
        if let Some(s) = *snap {
            return s;
        }
        let s = KillSnapshot {
            at: Instant::now(),
            publishing: self.activity.publishing.load(Ordering::Acquire) > 0,
            retiring: self.activity.retiring.load(Ordering::Acquire),
        };
        // An error means it is gone already, which is what a kill wants.
        let _ = lock(&self.child).kill();
        *snap = Some(s);
        s
    }

    /// Whether it has been killed.
    pub fn killed(&self) -> bool {
        lock(&self.snapshot).is_some()
    }
}

/// A phase the log reader kills the daemon in: when its `begin` comes, after `delay`.
#[derive(Debug, Clone, Copy)]
pub struct Trigger {
    /// [`PHASES`] index.
    pub phase: usize,
    /// How long after the `begin` line.
    pub delay: Duration,
}

/// A running daemon.
pub struct Daemon {
    killer: Arc<Killer>,
    log: Arc<Mutex<LogState>>,
    trigger: Arc<Mutex<Option<Trigger>>>,
    reader: Option<JoinHandle<()>>,
    socket: PathBuf,
    stdout: BufReader<ChildStdout>,
}

/// The value of `key=` in a marker line (quotes removed).
fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    let at = line.find(&format!("{key}="))?;
    let rest = &line[at + key.len() + 1..];
    let end = rest.find(char::is_whitespace).unwrap_or(rest.len());
    Some(rest[..end].trim_matches('"'))
}

/// `line` without ANSI escape sequences.
fn plain(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // CSI: ESC [ parameters final-letter.
            for d in chars.by_ref() {
                if d.is_ascii_alphabetic() {
                    break;
                }
            }
            continue;
        }
        out.push(c);
    }
    out
}

impl LogState {
    /// Takes one log line into account; returns the phase whose `begin` it is, if any.
    pub fn take(&mut self, line: &str) -> Option<usize> {
        if line.contains(" WARN ") || line.contains(" ERROR ") {
            self.warnings += 1;
            if self.first_warnings.len() < KEPT_WARNINGS {
                self.first_warnings.push(line.trim().to_owned());
            }
            if line.contains("background compaction failed") {
                self.open[COMPACT] = false;
            }
        }
        if field(line, "recycled") == Some("true") {
            self.recycled += 1;
        }
        let phase = match field(line, "phase")? {
            "salvage" => COMPACT,
            p => PHASES.iter().position(|q| *q == p)?,
        };
        match field(line, "step")? {
            "begin" => {
                if phase == COMPACT && field(line, "segments") == Some("0") {
                    return None;
                }
                self.open[phase] = true;
                self.begins[phase] += 1;
                if phase == RECLAIM
                    && let Some(id) = field(line, "segment").and_then(|s| s.parse().ok())
                {
                    self.reclaimed.push(id);
                }
                Some(phase)
            }
            "end" => {
                self.open[phase] = false;
                self.ends[phase] += 1;
                if phase == COMPACT {
                    let n: u64 = field(line, "inputs")
                        .and_then(|s| s.parse().ok())
                        .unwrap_or(0);
                    if n > 0 {
                        self.compactions += 1;
                        self.compacted_segments += n;
                    }
                }
                None
            }
            _ => None,
        }
    }
}

impl Daemon {
    /// Starts `orbitkv serve` on the options' data directory and waits until it listens.
    pub fn start(o: &DaemonOptions, activity: Arc<Activity>) -> Result<Self, String> {
        let socket = o.data_dir.join("orbitkv.sock");
        let mut child = Command::new(&o.exe)
            .arg("serve")
            .arg("--json")
            .arg("--data-dir")
            .arg(&o.data_dir)
            .arg("--socket")
            .arg(&socket)
            .args(["--metrics", "127.0.0.1:0", "--log-level", "debug"])
            .arg("--dram-bytes")
            .arg(o.waiting_bytes.to_string())
            .arg("--waiting-bytes")
            .arg(o.waiting_bytes.to_string())
            .args(["--policy", o.policy.name()])
            .arg("--ssd-bytes")
            .arg(o.ssd_bytes.to_string())
            .arg("--segment-bytes")
            .arg(o.segment_bytes.to_string())
            .arg("--compact-interval")
            .arg(format!("{}ms", o.compact_interval.as_millis()))
            .arg("--compact-threshold")
            .arg(o.compact_threshold.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("starting {} serve: {e}", o.exe.display()))?;
        let (Some(stdout), Some(stderr)) = (child.stdout.take(), child.stderr.take()) else {
            let _ = child.kill();
            let _ = child.wait();
            return Err("the daemon's output pipes are missing".to_owned());
        };
        let killer = Arc::new(Killer {
            child: Mutex::new(child),
            activity,
            snapshot: Mutex::new(None),
        });
        let log = Arc::new(Mutex::new(LogState::default()));
        let trigger: Arc<Mutex<Option<Trigger>>> = Arc::new(Mutex::new(None));
        let tail = Arc::new(Mutex::new(Vec::<String>::new()));
        let reader = {
            let (killer, log, trigger, tail) =
                (killer.clone(), log.clone(), trigger.clone(), tail.clone());
            std::thread::Builder::new()
                .name("crashtest-log".to_owned())
                .spawn(move || read_log(stderr, &killer, &log, &trigger, &tail))
                .map_err(|e| format!("starting the log reader: {e}"))?
        };
        let mut daemon = Daemon {
            killer,
            log,
            trigger,
            reader: Some(reader),
            socket,
            stdout: BufReader::new(stdout),
        };
        let mut line = String::new();
        let read = daemon.stdout.read_line(&mut line);
        let listening = serde_json::from_str::<serde_json::Value>(&line)
            .ok()
            .and_then(|v| v["socket"].as_str().map(PathBuf::from));
        match (read, listening) {
            (Ok(_), Some(s)) if s == daemon.socket => Ok(daemon),
            (read, _) => {
                daemon.killer.kill();
                daemon.reap();
                let said = lock(&tail).join("\n");
                Err(format!(
                    "the daemon did not start ({}): {said}",
                    match read {
                        Ok(0) => "it exited".to_owned(),
                        Ok(_) => format!("it printed {:?}", line.trim()),
                        Err(e) => e.to_string(),
                    }
                ))
            }
        }
    }

    /// Its control socket.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// What kills it.
    pub fn killer(&self) -> Arc<Killer> {
        self.killer.clone()
    }

    /// Arms the log reader to kill it when `t`'s phase next begins (`None` disarms).
    pub fn arm(&self, t: Option<Trigger>) {
        *lock(&self.trigger) = t;
    }

    /// What its log said so far.
    pub fn log(&self) -> LogState {
        lock(&self.log).clone()
    }

    /// Waits for it to exit and for its log to end; returns its exit status.
    fn reap(&mut self) -> Option<ExitStatus> {
        let status = lock(&self.killer.child).wait().ok();
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
        status
    }

    /// Kills it with SIGKILL (unless the log reader did) and waits for it to die; returns what
    /// was in flight then and its whole log (every line it wrote before it died).
    pub fn kill(mut self) -> (KillSnapshot, LogState) {
        let snap = self.killer.kill();
        self.reap();
        (snap, self.log())
    }

    /// Sends it SIGTERM; returns when.
    pub fn terminate(&self) -> Instant {
        terminate(lock(&self.killer.child).id());
        Instant::now()
    }

    /// Stops it with SIGTERM (SIGKILL after `limit`); returns whether it exited 0, and its log.
    pub fn stop(mut self, limit: Duration) -> (bool, LogState) {
        let pid = lock(&self.killer.child).id();
        terminate(pid);
        let deadline = Instant::now() + limit;
        let clean = loop {
            match lock(&self.killer.child).try_wait() {
                Ok(Some(s)) => break s.success(),
                Ok(None) if Instant::now() < deadline => {}
                _ => {
                    self.killer.kill();
                    break false;
                }
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        self.reap();
        (clean, self.log())
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if self.reader.is_some() {
            self.killer.kill();
            self.reap();
        }
    }
}

/// Sends SIGTERM to `pid`.
#[expect(unsafe_code, reason = "sending a signal has no safe wrapper in std")]
fn terminate(pid: u32) {
    if let Ok(pid) = libc::pid_t::try_from(pid) {
        // SAFETY: kill only sends a signal, to the child this harness started and has not reaped.
        unsafe {
            libc::kill(pid, libc::SIGTERM);
        }
    }
}

/// The log reader: every line is taken into account, the last few kept for errors; an armed
/// phase's `begin` kills the daemon.
fn read_log(
    stderr: impl Read,
    killer: &Killer,
    log: &Mutex<LogState>,
    trigger: &Mutex<Option<Trigger>>,
    tail: &Mutex<Vec<String>>,
) {
    let mut reader = BufReader::new(stderr);
    let mut raw = Vec::new();
    loop {
        raw.clear();
        match reader.read_until(b'\n', &mut raw) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        let line = plain(&String::from_utf8_lossy(&raw));
        let began = lock(log).take(&line);
        {
            let mut t = lock(tail);
            if t.len() >= 20 {
                t.remove(0);
            }
            t.push(line.trim().to_owned());
        }
        let Some(phase) = began else {
            continue;
        };
        let armed = (*lock(trigger)).filter(|t| t.phase == phase);
        if let Some(t) = armed {
            *lock(trigger) = None;
            std::thread::sleep(t.delay);
            killer.kill();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markers_open_and_close_phases_and_count_what_they_did() {
        let mut s = LogState::default();
        let line = |l: &str| format!("2025-01-01T00:00:00.000000Z DEBUG {l}");
        assert_eq!(
            s.take(&line(r#"phase="seal" step="begin" segment=7"#)),
            Some(SEAL)
        );
        assert!(s.open[SEAL]);
        assert_eq!(s.take(&line(r#"phase="seal" step="end" segment=7"#)), None);
        assert!(!s.open[SEAL]);
        // A compaction with nothing to consider is no compaction.
        assert_eq!(
            s.take(&line(r#"phase="compact" step="begin" segments=0"#)),
            None
        );
        assert!(!s.open[COMPACT]);
        assert_eq!(
            s.take(&line(r#"phase="compact" step="begin" segments=3"#)),
            Some(COMPACT)
        );
        s.take(&line(r#"phase="compact" step="end" inputs=2"#));
        assert_eq!((s.compactions, s.compacted_segments), (1, 2));
        s.take(&line("phase=\"reclaim\" step=\"begin\" segment=42\n"));
        assert!(s.open[RECLAIM]);
        assert_eq!(s.reclaimed, vec![42]);
        assert_eq!(
            s.take(&line(
                "segment=43 recycled=true a new segment over the spare file"
            )),
            None
        );
        assert_eq!(s.recycled, 1);
        s.take(&line(r#"phase="compact" step="begin" segments=1"#));
        s.take("2025-01-01T00:00:00Z  WARN background compaction failed: disk on fire");
        assert!(!s.open[COMPACT]);
        assert_eq!(s.warnings, 1);
        let colored = "\u{1b}[2m2025\u{1b}[0m \u{1b}[34mDEBUG\u{1b}[0m \u{1b}[3mphase\u{1b}[0m\u{1b}[2m=\u{1b}[0m\"retire\" \u{1b}[3mstep\u{1b}[0m\u{1b}[2m=\u{1b}[0m\"begin\"";
        assert_eq!(s.take(&plain(colored)), Some(RETIRE));
    }
}
