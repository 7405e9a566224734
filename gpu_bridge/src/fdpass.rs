//! Passing a pool region's descriptor over a Unix socket (`SCM_RIGHTS`), with a small message
//! beside it: how an engine hands its host pool to the manager. Also the socket calls std has no
//! wrapper for that the manager's replies need (a send that never waits), and a peer's
//! credentials (`SO_PEERCRED`), which the manager checks and an engine notes of its daemon.

use std::io;
use std::mem::size_of;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;

/// Control-message buffer, 8-aligned, with room for a few descriptors.
#[repr(C, align(8))]
struct CmsgBuf([u8; 64]);

/// Descriptors one message may carry at most.
pub const MAX_FDS: usize = 4;

/// Sends `bytes` and `fd` in one message.
pub fn send_with_fd(sock: &UnixStream, bytes: &[u8], fd: BorrowedFd<'_>) -> io::Result<()> {
    send_with_fds(sock, bytes, &[fd])
}

/// Sends `bytes` and `fds` (1 to [`MAX_FDS`], in order) in one message.
#[expect(
    unsafe_code,
    reason = "sendmsg with SCM_RIGHTS has no safe wrapper in std"
)]
pub fn send_with_fds(sock: &UnixStream, bytes: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    if bytes.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "a descriptor travels with at least one byte",
        ));
    }
    if fds.is_empty() || fds.len() > MAX_FDS {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("1 to {MAX_FDS} descriptors travel with a message"),
        ));
    }
    let mut cbuf = CmsgBuf([0; 64]);
    let mut iov = libc::iovec {
        iov_base: bytes.as_ptr().cast_mut().cast(),
        iov_len: bytes.len(),
    };
    let fd_len = (fds.len() * size_of::<libc::c_int>()) as libc::c_uint;
    // SAFETY: CMSG_SPACE/CMSG_LEN only compute sizes.
    let (space, len) = unsafe { (libc::CMSG_SPACE(fd_len), libc::CMSG_LEN(fd_len)) };
    // SAFETY: an all-zero msghdr is valid (null pointers, zero lengths); the fields set below
    // point at `iov` and `cbuf`, which outlive the sendmsg call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.0.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    // SAFETY: `msg` has a control buffer of `space` bytes (≤ 64 for at most MAX_FDS ints), so
    // the first header exists and its data area holds `fds.len()` ints; the writes stay inside
    // `cbuf`.
    let sent = unsafe {
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        if cmsg.is_null() {
            return Err(io::Error::other("no room for the control message"));
        }
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = libc::SCM_RIGHTS;
        (*cmsg).cmsg_len = len as _;
        let data = libc::CMSG_DATA(cmsg).cast::<libc::c_int>();
        for (i, fd) in fds.iter().enumerate() {
            std::ptr::write_unaligned(data.add(i), fd.as_raw_fd());
        }
        libc::sendmsg(sock.as_raw_fd(), &msg, libc::MSG_NOSIGNAL)
    };
    if sent < 0 {
        return Err(io::Error::last_os_error());
    }
    if sent as usize != bytes.len() {
        return Err(io::Error::new(
            io::ErrorKind::WriteZero,
            "the message beside the descriptor was cut short",
        ));
    }
    Ok(())
}

/// Receives one message into `buf`: its length and the first descriptor that came with it, if
/// any (received close-on-exec; any others are closed).
pub fn recv_with_fd(sock: &UnixStream, buf: &mut [u8]) -> io::Result<(usize, Option<OwnedFd>)> {
    let (n, fds) = recv_with_fds(sock, buf)?;
    Ok((n, fds.into_iter().next()))
}

/// Receives one message into `buf`: its length and the descriptors that came with it, in
/// order (received close-on-exec; beyond [`MAX_FDS`], closed).
#[expect(
    unsafe_code,
    reason = "recvmsg with SCM_RIGHTS has no safe wrapper in std"
)]
pub fn recv_with_fds(sock: &UnixStream, buf: &mut [u8]) -> io::Result<(usize, Vec<OwnedFd>)> {
    let mut cbuf = CmsgBuf([0; 64]);
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: as in `send_with_fd`; `iov` and `cbuf` outlive the recvmsg call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.0.as_mut_ptr().cast();
    msg.msg_controllen = cbuf.0.len() as _;
    // SAFETY: recvmsg writes at most the buffers `msg` describes.
    let n = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut fds = Vec::new();
    // SAFETY: the kernel filled `msg_controllen` bytes of `cbuf` with well-formed control
    // messages; CMSG_FIRSTHDR/CMSG_NXTHDR walk them within that length, and each SCM_RIGHTS
    // payload is an array of ints, read unaligned. Every descriptor received is owned here.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(cmsg);
                let header = data.offset_from(cmsg.cast::<u8>()) as usize;
                let count =
                    ((*cmsg).cmsg_len as usize).saturating_sub(header) / size_of::<libc::c_int>();
                for i in 0..count {
                    let raw = std::ptr::read_unaligned(data.cast::<libc::c_int>().add(i));
                    fds.push(OwnedFd::from_raw_fd(raw));
                }
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
    }
    if msg.msg_flags & libc::MSG_CTRUNC != 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "control message truncated (too many descriptors)",
        ));
    }
    // Extra descriptors are dropped (closed) here.
    fds.truncate(MAX_FDS);
    Ok((n as usize, fds))
}

/// Sends what of `bytes` the socket takes now without waiting (`MSG_DONTWAIT`; no `SIGPIPE`);
/// returns how many bytes it took (`WouldBlock` when none).
#[expect(
    unsafe_code,
    reason = "a send that never waits, on a socket whose reads block, has no safe wrapper in std"
)]
pub fn send_nonblocking(sock: &UnixStream, bytes: &[u8]) -> io::Result<usize> {
    loop {
        // SAFETY: the pointer and length describe `bytes`, which outlives the call; send reads
        // at most that many bytes.
        let n = unsafe {
            libc::send(
                sock.as_raw_fd(),
                bytes.as_ptr().cast(),
                bytes.len(),
                libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
            )
        };
        if n >= 0 {
            return Ok(n as usize);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Seek, Write};

    #[test]
    fn a_descriptor_and_its_message_arrive_together() -> io::Result<()> {
        let (a, b) = UnixStream::pair()?;
        let mut f = tempfile::tempfile()?;
        f.write_all(b"shared bytes")?;
        send_with_fd(&a, b"pool 7", std::os::fd::AsFd::as_fd(&f))?;
        let mut buf = [0u8; 32];
        let (n, fd) = recv_with_fd(&b, &mut buf)?;
        assert_eq!(&buf[..n], b"pool 7");
        let mut g = std::fs::File::from(fd.ok_or_else(|| io::Error::other("no descriptor"))?);
        g.rewind()?;
        let mut s = String::new();
        g.read_to_string(&mut s)?;
        assert_eq!(s, "shared bytes");
        // A message without a descriptor is just a message.
        (&a).write_all(b"plain")?;
        let (n, fd) = recv_with_fd(&b, &mut buf)?;
        assert_eq!(&buf[..n], b"plain");
        assert!(fd.is_none());
        // Two descriptors arrive in order.
        let mut g = tempfile::tempfile()?;
        g.write_all(b"second")?;
        send_with_fds(
            &a,
            b"two",
            &[std::os::fd::AsFd::as_fd(&f), std::os::fd::AsFd::as_fd(&g)],
        )?;
        let (n, fds) = recv_with_fds(&b, &mut buf)?;
        assert_eq!((&buf[..n], fds.len()), (&b"two"[..], 2));
        let mut second = std::fs::File::from(
            fds.into_iter()
                .nth(1)
                .ok_or_else(|| io::Error::other("none"))?,
        );
        second.rewind()?;
        let mut s = String::new();
        second.read_to_string(&mut s)?;
        assert_eq!(s, "second");
        Ok(())
    }
}
