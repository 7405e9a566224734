//! Finding the daemon's control socket, the same way for every engine adapter: the adapter's
//! configured path, else `ORBITKV_SOCKET`, else `./orbitkv-data/orbitkv.sock` where it exists
//! (what `orbitkv serve` creates with its defaults), else the packaged service's socket.

use std::ffi::OsString;
use std::fmt;
use std::io;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

/// The environment variable naming the daemon's socket (read by `orbitkv serve` too).
pub const SOCKET_VAR: &str = "ORBITKV_SOCKET";
/// The socket `orbitkv serve` creates with its defaults, relative to its working directory.
pub const LOCAL_SOCKET: &str = "orbitkv-data/orbitkv.sock";
/// The socket of the packaged service (deploy/orbitkv.service).
pub const SYSTEM_SOCKET: &str = "/run/orbitkv/orbitkv.sock";

/// The paths to try, in order: only `configured` when given; else only the variable's value
/// when set and not empty; else [`LOCAL_SOCKET`] (when it exists) and then [`SYSTEM_SOCKET`].
pub fn socket_candidates(configured: Option<&Path>, env: Option<OsString>) -> Vec<PathBuf> {
    if let Some(p) = configured {
        return vec![p.to_owned()];
    }
    if let Some(v) = env.filter(|v| !v.is_empty()) {
        return vec![PathBuf::from(v)];
    }
    let mut out = Vec::new();
    let local = Path::new(".").join(LOCAL_SOCKET);
    if local.exists() {
        out.push(local);
    }
    out.push(PathBuf::from(SYSTEM_SOCKET));
    out
}

/// No candidate socket answered.
#[derive(Debug)]
pub struct NotFound {
    /// Each path tried, with why it failed.
    pub tried: Vec<(PathBuf, io::Error)>,
}

impl fmt::Display for NotFound {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("no OrbitKV daemon answered; tried")?;
        for (i, (p, e)) in self.tried.iter().enumerate() {
            let sep = if i == 0 { " " } else { "; " };
            write!(f, "{sep}{} ({e})", p.display())?;
        }
        write!(
            f,
            ". Start `orbitkv serve`, or name its socket in the adapter's `socket` setting or in {SOCKET_VAR}"
        )
    }
}

impl std::error::Error for NotFound {}

/// Connects to the first candidate that accepts ([`socket_candidates`], with this process's
/// `ORBITKV_SOCKET`); returns the stream and the path it answered at.
pub fn connect(configured: Option<&Path>) -> Result<(UnixStream, PathBuf), NotFound> {
    let mut tried = Vec::new();
    for p in socket_candidates(configured, std::env::var_os(SOCKET_VAR)) {
        match UnixStream::connect(&p) {
            Ok(s) => return Ok((s, p)),
            Err(e) => tried.push((p, e)),
        }
    }
    Err(NotFound { tried })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn configured_then_variable_then_the_defaults() {
        let c = Path::new("/x/a.sock");
        assert_eq!(
            socket_candidates(Some(c), Some("/y/b.sock".into())),
            vec![PathBuf::from("/x/a.sock")]
        );
        assert_eq!(
            socket_candidates(None, Some("/y/b.sock".into())),
            vec![PathBuf::from("/y/b.sock")]
        );
        // An empty variable counts as unset.
        let defaults = socket_candidates(None, Some(OsString::new()));
        assert_eq!(defaults.last(), Some(&PathBuf::from(SYSTEM_SOCKET)));
    }

    #[test]
    fn the_error_names_every_path_tried() {
        let dir = std::env::temp_dir().join(format!("orbitkv-discover-{}", std::process::id()));
        let missing = dir.join("none.sock");
        let e = match connect(Some(&missing)) {
            Err(e) => e,
            Ok(_) => panic!("nothing listens there"),
        };
        assert_eq!(e.tried.len(), 1);
        let text = e.to_string();
        assert!(text.contains(&missing.display().to_string()), "{text}");
        assert!(text.contains(SOCKET_VAR), "{text}");
    }
}
