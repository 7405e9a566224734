//! A process named by its id, told apart from a later one that reuses the id: the daemon an
//! adapter connected to, so that it can tell later whether that process still lives (a copy it
//! holds an engine page for may still land) or is gone (nothing of it can).

/// A process: its id, and its start time where `/proc` tells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Process {
    /// Its id.
    pub pid: u32,
    started: Option<u64>,
}

impl Process {
    /// Process `pid` as it is now (its start time noted).
    pub fn new(pid: u32) -> Self {
        Self {
            pid,
            started: start_time(pid),
        }
    }

    /// Whether the process still runs or is stopped: its id names a process that is not a
    /// zombie, started when this one did (an id reused by another process is not it).
    pub fn alive(&self) -> bool {
        match start_time(self.pid) {
            Some(t) => self.started.is_none_or(|s| s == t),
            None => false,
        }
    }
}

/// The start time (clock ticks after boot) of live process `pid`; `None` when there is none,
/// it is a zombie, or `/proc` cannot tell.
fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_start_time(&stat)
}

/// The start time in a `/proc/PID/stat` line; `None` for a zombie or a dead process. The
/// command name (field 2) may hold spaces and parentheses: fields are counted after its last
/// `)`, where field 3 (the state) comes first and field 22 (the start time) 19 later.
fn parse_start_time(stat: &str) -> Option<u64> {
    let mut fields = stat.rsplit_once(')')?.1.split_whitespace();
    let state = fields.next()?;
    if matches!(state, "Z" | "X" | "x") {
        return None;
    }
    fields.nth(18)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::{Process, parse_start_time};

    #[test]
    fn a_process_lives_until_it_has_exited() {
        assert!(Process::new(std::process::id()).alive());
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap_or_else(|e| panic!("{e}"));
        let p = Process::new(child.id());
        assert!(p.alive());
        child.kill().unwrap_or_else(|e| panic!("{e}"));
        // Killed but not yet reaped: a zombie copies nothing.
        std::thread::sleep(std::time::Duration::from_millis(100));
        assert!(!p.alive(), "a zombie is alive");
        child.wait().unwrap_or_else(|e| panic!("{e}"));
        assert!(!p.alive());
    }

    #[test]
    fn the_start_time_is_read_past_the_command_name() {
        let line = "4242 (orbitkv (serve) x) S 1 4242 4242 0 -1 4194560 100 0 0 0 3 1 0 0 20 0 \
                    9 0 123456 1000 10 18446744073709551615";
        assert_eq!(parse_start_time(line), Some(123_456));
        let zombie = line.replace(") S ", ") Z ");
        assert_eq!(parse_start_time(&zombie), None);
        assert_eq!(parse_start_time("4242 (cut"), None);
    }
}
