//! The metrics exporter: an HTTP server for `GET /metrics`.
//! A request head is bounded in size and time; a response must be taken within a deadline.
//! At most [`MAX_SCRAPES`] run at once, each on its own thread; the accept loop never waits on
//! a client.

use std::io::{self, Read as _, Write as _};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::CONTENT_TYPE;

/// Bytes of a request head (request line and headers) read at most; a longer one gets 431.
pub const MAX_REQUEST_HEAD: usize = 8 << 10;
/// Scrapes served at once; a connection beyond them gets 503 at once.
pub const MAX_SCRAPES: usize = 16;
/// Time a scraper has to send its whole request head.
const READ_DEADLINE: Duration = Duration::from_secs(5);
/// Time a scraper has to take the whole response.
const WRITE_DEADLINE: Duration = Duration::from_secs(5);
/// How often the accept loop checks for a stop while no one connects.
const ACCEPT_POLL: Duration = Duration::from_millis(20);
/// How long a drop waits for scrapes still running after it closed their connections.
const STOP_WAIT: Duration = Duration::from_secs(1);

/// What the exporter serves: the text of one scrape.
type Source = Mutex<Box<dyn Fn() -> String + Send>>;

/// State the accept loop, the scrapes and the exporter share.
struct Shared {
    stop: AtomicBool,
    /// The connections being served, by scrape number; a drop shuts them down.
    scrapes: Mutex<Vec<(u64, TcpStream)>>,
    /// Signalled when a scrape ends.
    ended: Condvar,
}

fn lock<T: ?Sized>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Takes a scrape off the shared list when it ends (its thread's end, panic or failed spawn).
struct Ended {
    shared: Arc<Shared>,
    id: u64,
}

impl Drop for Ended {
    fn drop(&mut self) {
        lock(&self.shared.scrapes).retain(|(id, _)| *id != self.id);
        self.shared.ended.notify_all();
    }
}

/// An HTTP exporter: `GET /metrics` answers the text of `source()`; other paths get 404.
///
/// One thread accepts and never waits on a client.
/// Each scrape runs on its own thread, at most [`MAX_SCRAPES`] at once.
/// A scrape reads at most [`MAX_REQUEST_HEAD`] bytes, within 5 s, and writes within 5 s.
pub struct Exporter {
    addr: SocketAddr,
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl Exporter {
    /// Listens on `addr` (`127.0.0.1:0` picks a free port) and serves until dropped.
    pub fn start(addr: &str, source: impl Fn() -> String + Send + 'static) -> io::Result<Self> {
        let listener = TcpListener::bind(addr)?;
        let local = listener.local_addr()?;
        listener.set_nonblocking(true)?;
        let shared = Arc::new(Shared {
            stop: AtomicBool::new(false),
            scrapes: Mutex::new(Vec::new()),
            ended: Condvar::new(),
        });
        let source: Arc<Source> = Arc::new(Mutex::new(Box::new(source)));
        let thread = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("orbitkv-metrics".into())
                .spawn(move || accept_loop(&listener, &shared, &source))?
        };
        Ok(Self {
            addr: local,
            shared,
            thread: Some(thread),
        })
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for Exporter {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        // No scrape starts now; closing their connections ends their reads and writes.
        let deadline = Instant::now() + STOP_WAIT;
        let mut held = lock(&self.shared.scrapes);
        for (_, s) in held.iter() {
            let _ = s.shutdown(Shutdown::Both);
        }
        while !held.is_empty() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            held = match self.shared.ended.wait_timeout(held, left) {
                Ok((g, _)) => g,
                Err(e) => e.into_inner().0,
            };
        }
    }
}

/// Accepts until stopped; hands each connection to a scrape thread, or refuses it.
fn accept_loop(listener: &TcpListener, shared: &Arc<Shared>, source: &Arc<Source>) {
    let mut next = 0u64;
    while !shared.stop.load(Ordering::Acquire) {
        match listener.accept() {
            Ok((s, _)) => {
                next = next.wrapping_add(1);
                admit(shared, source, s, next);
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            // Nothing to accept, or out of descriptors: wait a little either way.
            Err(_) => std::thread::sleep(ACCEPT_POLL),
        }
    }
}

/// Starts a scrape of `s`, or answers 503 without waiting when [`MAX_SCRAPES`] are running.
fn admit(shared: &Arc<Shared>, source: &Arc<Source>, s: TcpStream, id: u64) {
    {
        let mut held = lock(&shared.scrapes);
        if held.len() >= MAX_SCRAPES {
            drop(held);
            return refuse(&s);
        }
        let Ok(clone) = s.try_clone() else {
            drop(held);
            return refuse(&s);
        };
        held.push((id, clone));
    }
    let ended = Ended {
        shared: shared.clone(),
        id,
    };
    let source = source.clone();
    // A failed spawn drops the closure: the connection closes and `ended` takes it off.
    let _ = std::thread::Builder::new()
        .name("orbitkv-scrape".into())
        .spawn(move || {
            let _ended = ended;
            serve(s, &source);
        });
}

/// Answers 503 with one non-blocking write and closes.
fn refuse(mut s: &TcpStream) {
    let _ = s.set_nonblocking(true);
    let _ = s.write(
        b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
    );
    let _ = s.shutdown(Shutdown::Write);
}

/// How reading a request head ended.
enum Head {
    /// The head, through its blank line, is this many bytes.
    Complete(usize),
    /// [`MAX_REQUEST_HEAD`] bytes came without the blank line.
    TooLarge,
    /// The client closed, failed or ran out of time.
    Incomplete,
}

/// One scrape: reads the request head, answers and closes.
fn serve(mut s: TcpStream, source: &Source) {
    if s.set_nonblocking(false).is_err() {
        return;
    }
    let mut buf = [0u8; MAX_REQUEST_HEAD];
    let response = match read_head(&mut s, &mut buf) {
        Head::Complete(n) => respond(buf.get(..n).unwrap_or_default(), source),
        Head::TooLarge => status(431, "Request Header Fields Too Large", ""),
        Head::Incomplete => return,
    };
    if write_by(&mut s, &response, Instant::now() + WRITE_DEADLINE).is_ok() {
        let _ = s.shutdown(Shutdown::Write);
    }
}

/// Reads into `buf` up to the blank line that ends a request head, within [`READ_DEADLINE`].
fn read_head(s: &mut TcpStream, buf: &mut [u8]) -> Head {
    let deadline = Instant::now() + READ_DEADLINE;
    let mut len = 0;
    loop {
        let free = match buf.get_mut(len..) {
            Some(free) if !free.is_empty() => free,
            _ => return Head::TooLarge,
        };
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || s.set_read_timeout(Some(left)).is_err() {
            return Head::Incomplete;
        }
        match s.read(free) {
            Ok(0) => return Head::Incomplete,
            Ok(n) => {
                // The blank line may straddle the previous read.
                let from = len.saturating_sub(3);
                len += n;
                if let Some(end) = buf.get(from..len).and_then(head_end) {
                    return Head::Complete(from + end);
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return Head::Incomplete,
        }
    }
}

/// Where the first blank line (`\n\n` or `\n\r\n`) of `b` ends.
fn head_end(b: &[u8]) -> Option<usize> {
    b.windows(2).enumerate().find_map(|(i, w)| match w {
        [b'\n', b'\n'] => Some(i + 2),
        [b'\n', b'\r'] if b.get(i + 2) == Some(&b'\n') => Some(i + 3),
        _ => None,
    })
}

/// The response to a complete request head.
fn respond(head: &[u8], source: &Source) -> Vec<u8> {
    let line = head.split(|b| *b == b'\n').next().unwrap_or_default();
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let mut parts = line.split(|b| *b == b' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return status(400, "Bad Request", "");
    };
    if !version.starts_with(b"HTTP/1.") {
        return status(400, "Bad Request", "");
    }
    let path = target.split(|b| *b == b'?').next().unwrap_or_default();
    if path != b"/metrics" {
        return status(404, "Not Found", "");
    }
    let get = match method {
        b"GET" => true,
        b"HEAD" => false,
        _ => return status(405, "Method Not Allowed", "Allow: GET, HEAD\r\n"),
    };
    let body = (lock(source))();
    let mut out = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: {CONTENT_TYPE}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    if get {
        out.extend_from_slice(body.as_bytes());
    }
    out
}

/// An answer with no body; `extra` is more header lines, each ending in CRLF.
fn status(code: u16, reason: &str, extra: &str) -> Vec<u8> {
    format!("HTTP/1.1 {code} {reason}\r\n{extra}Content-Length: 0\r\nConnection: close\r\n\r\n")
        .into_bytes()
}

/// Writes all of `bytes` before `deadline`, or fails.
fn write_by(s: &mut TcpStream, bytes: &[u8], deadline: Instant) -> io::Result<()> {
    let mut rest = bytes;
    while !rest.is_empty() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::ErrorKind::TimedOut.into());
        }
        s.set_write_timeout(Some(left))?;
        match s.write(rest) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => rest = rest.get(n..).unwrap_or_default(),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_head_ends_at_its_first_blank_line() {
        assert_eq!(head_end(b"GET / HTTP/1.1\r\n\r\n"), Some(18));
        assert_eq!(head_end(b"GET / HTTP/1.1\n\nrest"), Some(16));
        assert_eq!(head_end(b"GET / HTTP/1.1\r\nHost: x\r\n"), None);
        assert_eq!(head_end(b"\n\r"), None);
        assert_eq!(head_end(b""), None);
    }

    #[test]
    fn requests_are_answered_by_their_line() {
        let source: Source = Mutex::new(Box::new(|| "orbitkv_x 1\n".to_owned()));
        let answer = |head: &[u8]| String::from_utf8(respond(head, &source)).unwrap();
        let ok = answer(b"GET /metrics?x=1 HTTP/1.1\r\nHost: h\r\n\r\n");
        assert!(ok.starts_with("HTTP/1.1 200 OK\r\n"), "{ok}");
        assert!(
            ok.contains(&format!("Content-Type: {CONTENT_TYPE}\r\n")),
            "{ok}"
        );
        assert!(ok.ends_with("\r\n\r\norbitkv_x 1\n"), "{ok}");
        let head = answer(b"HEAD /metrics HTTP/1.0\r\n\r\n");
        assert!(head.contains("Content-Length: 12\r\n"), "{head}");
        assert!(head.ends_with("\r\n\r\n"), "{head}");
        for (request, code) in [
            (&b"GET / HTTP/1.1\r\n\r\n"[..], "404"),
            (b"POST /metrics HTTP/1.1\r\n\r\n", "405"),
            (b"GET /metrics\r\n\r\n", "400"),
            (b"GET /metrics HTTP/1.1 x\r\n\r\n", "400"),
            (b"PRI * HTTP/2.0\r\n\r\n", "400"),
            (b"GET /metrics SPDY/3\r\n\r\n", "400"),
            (b"\xff\xfe\r\n\r\n", "400"),
        ] {
            let a = answer(request);
            assert!(a.starts_with(&format!("HTTP/1.1 {code} ")), "{a}");
        }
    }
}
