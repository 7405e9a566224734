//! Runs the `orbitkv` binary the way an operator's script would; [`daemon`] runs the daemon and
//! simulated engines as real processes.

#![allow(dead_code, reason = "shared by several test files; each uses a subset")]
#![expect(
    clippy::unwrap_used,
    reason = "test code: a failed unwrap is a failed test"
)]

use std::io::Write;
use std::process::{Command, Stdio};

pub mod daemon;

pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

/// Runs `orbitkv args…` with a clean identity environment plus `env`, feeding `stdin`.
pub fn orbitkv(args: &[&str], env: &[(&str, &str)], stdin: Option<&str>) -> Run {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_orbitkv"));
    cmd.args(args)
        .env_remove("ORBITKV_MODEL_FINGERPRINT")
        .env_remove("ORBITKV_CACHE_SCOPE")
        .env_remove("PYTHONHASHSEED")
        .env_remove("ORBITKV_LOG")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().unwrap();
    let mut pipe = child.stdin.take().unwrap();
    if let Some(s) = stdin {
        pipe.write_all(s.as_bytes()).unwrap();
    }
    drop(pipe);
    let out = child.wait_with_output().unwrap();
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8(out.stdout).unwrap(),
        stderr: String::from_utf8(out.stderr).unwrap(),
    }
}

impl Run {
    pub fn ok(self) -> Self {
        assert_eq!(self.code, 0, "stderr: {}", self.stderr);
        self
    }
    pub fn refused(self) -> Self {
        assert_eq!(
            self.code, 2,
            "stdout: {} stderr: {}",
            self.stdout, self.stderr
        );
        assert!(self.stderr.starts_with("orbitkv: "), "{}", self.stderr);
        assert_eq!(self.stderr.lines().count(), 1, "{}", self.stderr);
        assert!(!self.stderr.contains("panicked"), "{}", self.stderr);
        self
    }
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.stdout).unwrap()
    }
}
