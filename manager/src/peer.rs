//! Who is on the other end of a Unix socket (`SO_PEERCRED`), and whether they may talk to the
//! daemon.

use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;

/// A peer's credentials.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerCred {
    /// Process id.
    pub pid: i32,
    /// User id.
    pub uid: u32,
    /// Group id.
    pub gid: u32,
}

/// The credentials of `s`'s peer, as the kernel recorded them at connect.
#[expect(
    unsafe_code,
    reason = "getsockopt(SO_PEERCRED) has no safe wrapper in std"
)]
pub fn peer_cred(s: &UnixStream) -> io::Result<PeerCred> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `cred`, a live local of that size.
    let r = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            std::ptr::from_mut(&mut cred).cast(),
            &mut len,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(PeerCred {
        pid: cred.pid,
        uid: cred.uid,
        gid: cred.gid,
    })
}

/// This process's effective user id.
#[expect(unsafe_code, reason = "geteuid has no safe wrapper in std")]
pub fn own_uid() -> u32 {
    // SAFETY: geteuid takes no arguments and cannot fail.
    unsafe { libc::geteuid() }
}

/// Which peers may connect: the daemon's own user and root always; more users and groups when
/// configured.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PeerPolicy {
    /// Further user ids allowed.
    pub uids: Vec<u32>,
    /// Group ids allowed.
    pub gids: Vec<u32>,
}

impl PeerPolicy {
    /// Whether `p` may talk to the daemon.
    pub fn allows(&self, p: &PeerCred) -> bool {
        p.uid == 0 || p.uid == own_uid() || self.uids.contains(&p.uid) || self.gids.contains(&p.gid)
    }
}
