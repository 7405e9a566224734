//! The two calls on descriptors that std has no safe form of: borrowing a descriptor the
//! Python caller names by number (an engine's memory: SGLang's shared-memory host pool), and
//! waiting for a socket to become readable with a deadline. The only `unsafe` of the native
//! module.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use pyo3::Python;

/// Runs `f` with `fd` borrowed, once the kernel confirms it is an open descriptor; `None`
/// when it is not. The GIL token keeps Python code from closing it meanwhile; that no native
/// code of the process closes it is the caller's contract (an engine's pool memory stays open
/// while the engine runs).
#[expect(
    unsafe_code,
    reason = "a descriptor named by number has no safe borrow"
)]
pub(crate) fn with_borrowed<R>(
    _gil: Python<'_>,
    fd: RawFd,
    f: impl FnOnce(BorrowedFd<'_>) -> R,
) -> Option<R> {
    // SAFETY: fcntl(F_GETFD) reads the descriptor table only, with integer arguments.
    if fd < 0 || unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
        return None;
    }
    // SAFETY: `fd` is open (checked above). The caller holds the GIL for the whole call (the
    // token proves it), so the Python code that owns it cannot close it before `f` returns;
    // native code closing it meanwhile is outside the caller's contract. Even then the kernel
    // checks every use of the number: memory safety does not depend on it.
    let borrowed = unsafe { BorrowedFd::borrow_raw(fd) };
    Some(f(borrowed))
}

/// Waits until `stream` has bytes to read (or its peer closed it), at most `timeout` (`None`:
/// no limit); false when the time ran out first.
#[expect(unsafe_code, reason = "poll(2) has no safe wrapper in std")]
pub(crate) fn readable(stream: &UnixStream, timeout: Option<Duration>) -> io::Result<bool> {
    let ms = match timeout {
        None => -1,
        // Rounded up: a wait is never shortened to nothing.
        Some(t) => i32::try_from(t.as_micros().div_ceil(1000)).unwrap_or(i32::MAX),
    };
    let mut pfd = libc::pollfd {
        fd: stream.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    loop {
        // SAFETY: `pfd` is one valid pollfd that lives across the call; `stream` keeps its
        // descriptor open.
        let n = unsafe { libc::poll(&mut pfd, 1, ms) };
        if n >= 0 {
            return Ok(n > 0);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}
