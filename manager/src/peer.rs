//! Who is on the other end of a Unix socket (`SO_PEERCRED`), and whether they may talk to the
//! daemon.

pub use orbitkv_gpu_bridge::fdpass::{PeerCred, peer_cred};

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
