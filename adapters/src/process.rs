//! A process named by its id, told apart from a later one that reuses the id: the daemon an
//! adapter connected to, so that it can tell later whether that process is gone (nothing of it
//! can land in an engine page any more), stopped (a copy it is in the middle of may still land
//! when it resumes), or running.

use std::path::Path;

/// A process: its id and its start time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Process {
    /// Its id.
    pub pid: u32,
    started: u64,
}

/// What a [`Process`] is doing now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProcessState {
    /// Exited (a zombie too), or its id names another process now.
    Gone,
    /// One of its threads is stopped (SIGSTOP, a debugger): it may resume mid-copy.
    Stopped,
    /// Running or waiting.
    Running,
}

impl ProcessState {
    /// Its name: `gone`, `stopped`, `running`.
    pub fn name(self) -> &'static str {
        match self {
            ProcessState::Gone => "gone",
            ProcessState::Stopped => "stopped",
            ProcessState::Running => "running",
        }
    }
}

impl Process {
    /// Process `pid` as it is now; `None` when `/proc` does not show it (no such process, a
    /// zombie, `/proc` mounted with `hidepid`): it could not be told apart later.
    pub fn new(pid: u32) -> Option<Self> {
        let started = stat_of(&format!("/proc/{pid}/stat"))?.1;
        Some(Self { pid, started })
    }

    /// What it is doing now.
    pub fn state(&self) -> ProcessState {
        let root = format!("/proc/{}", self.pid);
        match stat_of(&format!("{root}/stat")) {
            Some((_, started)) if started == self.started => {}
            _ => return ProcessState::Gone,
        }
        // SIGSTOP stops every thread; a debugger may stop some: any one stopped counts.
        let stopped = std::fs::read_dir(Path::new(&root).join("task"))
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|t| std::fs::read_to_string(t.path().join("stat")).ok())
            .any(|stat| matches!(parse(&stat), Some((state, _)) if is_stopped(state)));
        if stopped {
            ProcessState::Stopped
        } else {
            ProcessState::Running
        }
    }
}

fn is_stopped(state: &str) -> bool {
    matches!(state, "T" | "t")
}

/// The state and start time in the stat file at `path`; `None` for a zombie or no process.
fn stat_of(path: &str) -> Option<(String, u64)> {
    let stat = std::fs::read_to_string(path).ok()?;
    parse(&stat).map(|(state, started)| (state.to_owned(), started))
}

/// The state (field 3) and start time (field 22, clock ticks after boot) in a
/// `/proc/PID/stat` line; `None` for a zombie or a dead process. The command name (field 2)
/// may hold spaces and parentheses: fields are counted after its last `)`.
fn parse(stat: &str) -> Option<(&str, u64)> {
    let mut fields = stat.rsplit_once(')')?.1.split_whitespace();
    let state = fields.next()?;
    if matches!(state, "Z" | "X" | "x") {
        return None;
    }
    Some((state, fields.nth(18)?.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use std::process::{Command, Stdio};
    use std::time::{Duration, Instant};

    use super::{Process, ProcessState, parse};

    /// Waits until `p` is in `want` (signals take effect asynchronously).
    fn until(p: &Process, want: ProcessState) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while p.state() != want {
            assert!(Instant::now() < deadline, "never {want:?}: {:?}", p.state());
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    #[test]
    fn a_process_is_running_stopped_then_gone() {
        let me = Process::new(std::process::id()).unwrap_or_else(|| panic!("no /proc"));
        assert_eq!(me.state(), ProcessState::Running);
        let mut child = Command::new("sleep")
            .arg("30")
            .stdout(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("{e}"));
        let p = Process::new(child.id()).unwrap_or_else(|| panic!("no /proc"));
        assert_eq!(p.state(), ProcessState::Running);
        let signal = |s: &str| {
            let ok = Command::new("kill")
                .args([s, &child.id().to_string()])
                .status()
                .is_ok_and(|st| st.success());
            assert!(ok, "kill {s}");
        };
        signal("-STOP");
        until(&p, ProcessState::Stopped);
        signal("-CONT");
        until(&p, ProcessState::Running);
        child.kill().unwrap_or_else(|e| panic!("{e}"));
        // Killed but not yet reaped: a zombie copies nothing.
        until(&p, ProcessState::Gone);
        child.wait().unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(p.state(), ProcessState::Gone);
    }

    #[test]
    fn the_state_and_start_time_are_read_past_the_command_name() {
        let line = "4242 (orbitkv (serve) x) S 1 4242 4242 0 -1 4194560 100 0 0 0 3 1 0 0 20 0 \
                    9 0 123456 1000 10 18446744073709551615";
        assert_eq!(parse(line), Some(("S", 123_456)));
        let zombie = line.replace(") S ", ") Z ");
        assert_eq!(parse(&zombie), None);
        assert_eq!(parse("4242 (cut"), None);
    }
}
