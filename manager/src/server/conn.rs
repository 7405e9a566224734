//! One client connection: its read loop (a frame at a time, each with a deadline once its first
//! byte has arrived; idle time between frames is unlimited), its replies (a bounded outbound
//! queue drained by the connection's own writer thread, with a send timeout) and the memory it
//! may hold. No thread ever waits on another peer's socket: a reply is queued without waiting,
//! and a peer that lets its replies pile up past the queue's bound is disconnected.

use std::collections::VecDeque;
use std::io::{self, Read};
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use orbitkv_gpu_bridge::fdpass::{MAX_FDS, recv_with_fds, send_nonblocking};
use orbitkv_protocol::frame::{ReadError, read_body};
use orbitkv_protocol::{ErrorCode, FrameHeader, HEADER_LEN, Message};
use orbitkv_store::FrameBuf;

use crate::metrics::inc;
use crate::session::{ConnId, Refusal};
use crate::transfer::Spare;

use super::Shared;

/// A reply not yet taken by the peer, and how much of it was sent.
struct Pending {
    frame: Vec<u8>,
    sent: usize,
}

#[derive(Default)]
struct OutState {
    queue: VecDeque<Pending>,
    /// Bytes queued (not yet sent).
    bytes: usize,
    /// The writer is sending the frame it took off the queue.
    writing: bool,
    closed: bool,
    /// No more replies will be queued: the writer closes the connection once it has sent the
    /// ones queued.
    finishing: bool,
    /// Closed because the peer did not take its replies.
    slow: bool,
}

/// A connection's replies on their way out: sent at once when the socket takes them, else
/// queued (at most `cap` bytes beyond one frame) for the connection's writer thread.
pub(crate) struct Outbox {
    state: Mutex<OutState>,
    wake: Condvar,
    /// The socket (a clone of the reader's: shutting it down ends both sides).
    stream: UnixStream,
    cap: usize,
}

impl Outbox {
    fn state(&self) -> MutexGuard<'_, OutState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sends `m` in reply to `request`, without waiting: what the socket does not take now goes
    /// to the queue. False when the connection is closed, or is closed now because its queue
    /// is full (the peer does not read its replies).
    /// A reply whose body would pass the frame limit (a Proof over many ranks and blocks) is
    /// answered `LimitExceeded` instead: the peer would refuse the frame and lose the
    /// connection.
    pub(crate) fn send(&self, request: u64, m: &Message) -> bool {
        let frame = match m.encode_frame(request) {
            Ok(f) if f.len() <= HEADER_LEN + self.cap => f,
            Ok(f) => {
                let refusal = Refusal::new(
                    ErrorCode::LimitExceeded,
                    format!(
                        "the reply of {} bytes passes the frame limit of {} bytes; ask for fewer blocks",
                        f.len() - HEADER_LEN,
                        self.cap
                    ),
                );
                let Ok(f) = refusal.message().encode_frame(request) else {
                    return false;
                };
                f
            }
            Err(_) => return false,
        };
        let mut st = self.state();
        if st.closed {
            return false;
        }
        let mut sent = 0;
        if st.queue.is_empty() && !st.writing {
            match send_nonblocking(&self.stream, &frame) {
                Ok(n) if n == frame.len() => return true,
                Ok(n) => sent = n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(_) => {
                    drop(st);
                    self.close();
                    return false;
                }
            }
        } else if st.bytes > 0 && st.bytes + frame.len() > self.cap {
            st.slow = true;
            drop(st);
            tracing::warn!("a peer does not read its replies: disconnecting it");
            self.close();
            return false;
        }
        st.bytes += frame.len() - sent;
        st.queue.push_back(Pending { frame, sent });
        self.wake.notify_one();
        true
    }

    /// Closes the connection: no more replies, the socket shut down both ways (its reader sees
    /// the end), the writer woken to exit.
    pub(crate) fn close(&self) {
        let mut st = self.state();
        if !st.closed {
            st.closed = true;
            st.queue.clear();
            st.bytes = 0;
            let _ = self.stream.shutdown(std::net::Shutdown::Both);
        }
        self.wake.notify_all();
    }

    /// No more replies: the writer sends those queued (each within the send timeout), then
    /// closes the connection.
    fn finish(&self) {
        let mut st = self.state();
        st.finishing = true;
        let idle = st.queue.is_empty() && !st.writing;
        drop(st);
        if idle {
            self.close();
        } else {
            self.wake.notify_all();
        }
    }

    /// Whether the connection is closed.
    pub(crate) fn is_closed(&self) -> bool {
        self.state().closed
    }

    /// Whether it was closed because the peer did not take its replies.
    pub(crate) fn was_slow(&self) -> bool {
        self.state().slow
    }

    /// The writer: sends queued replies in order, each within the send timeout, until closed.
    fn drain(&self) {
        use std::io::Write;
        loop {
            let p = {
                let mut st = self.state();
                while st.queue.is_empty() && !st.closed && !st.finishing {
                    st = self.wake.wait(st).unwrap_or_else(|e| e.into_inner());
                }
                if st.closed || (st.finishing && st.queue.is_empty()) {
                    drop(st);
                    self.close();
                    return;
                }
                let Some(p) = st.queue.pop_front() else {
                    continue;
                };
                st.bytes -= p.frame.len() - p.sent;
                st.writing = true;
                p
            };
            // The socket's send timeout bounds each write: a peer that takes nothing for that
            // long is closed.
            let written = (&self.stream).write_all(&p.frame[p.sent..]);
            let mut st = self.state();
            st.writing = false;
            if let Err(e) = written {
                if is_timeout(&e) {
                    st.slow = true;
                    tracing::warn!(
                        "a peer took no reply within the send timeout: disconnecting it"
                    );
                }
                drop(st);
                self.close();
                return;
            }
        }
    }
}

/// The memory a connection holds (frame bodies being read and handled, Publish copies waiting
/// to be stored, spare copy buffers), against its limit.
pub(crate) struct Memory {
    used: AtomicU64,
    limit: u64,
}

impl Memory {
    /// A budget of `limit` bytes, none taken.
    pub(crate) fn new(limit: u64) -> Self {
        Self {
            used: AtomicU64::new(0),
            limit,
        }
    }

    /// Takes `n` bytes of the budget; false (nothing taken) when that would pass the limit.
    pub(crate) fn reserve(&self, n: u64) -> bool {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
                u.checked_add(n).filter(|t| *t <= self.limit)
            })
            .is_ok()
    }

    /// Gives back `n` bytes taken by [`Memory::reserve`].
    pub(crate) fn release(&self, n: u64) {
        let _ = self
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
                Some(u.saturating_sub(n))
            });
    }

    /// Bytes held now.
    pub(crate) fn used(&self) -> u64 {
        self.used.load(Ordering::Acquire)
    }

    /// The limit.
    pub(crate) fn limit(&self) -> u64 {
        self.limit
    }
}

/// One connection as the rest of the server sees it.
pub(crate) struct Conn {
    /// Its number.
    pub(crate) id: ConnId,
    /// Its replies.
    pub(crate) outbox: Outbox,
    /// What it holds.
    pub(crate) memory: Memory,
    /// What every connection's Publish copies hold together (its own among them).
    pub(crate) publishes: Arc<Memory>,
    /// Copy buffers kept between its Publishes (each counted in `memory`).
    pub(crate) spare: Mutex<Spare>,
    /// The request id of its registration, which a seal reply answers.
    pub(crate) register_request: AtomicU64,
}

impl Conn {
    /// Its spare copy buffers.
    pub(crate) fn spare(&self) -> MutexGuard<'_, Spare> {
        self.spare.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Keeps `bufs` for its next Publishes, as far as its memory allows.
    pub(crate) fn give_back(&self, bufs: Vec<FrameBuf>) {
        let mut spare = self.spare();
        for b in bufs {
            let n = b.capacity() as u64;
            if self.memory.reserve(n) && !spare.give(b) {
                self.memory.release(n);
            }
        }
    }

    /// Takes a spare copy buffer, if it keeps one.
    pub(crate) fn take_spare(&self) -> Option<FrameBuf> {
        let b = self.spare().take()?;
        self.memory.release(b.capacity() as u64);
        Some(b)
    }
}

/// Reads frames off a socket with `recvmsg`, keeping any descriptor that arrives with them;
/// within a frame, no read waits past the frame's deadline.
struct FrameReader {
    stream: UnixStream,
    fds: Vec<OwnedFd>,
    /// The socket's read timeout as set now.
    timeout: Duration,
    frame_timeout: Duration,
    /// When the frame being read must be complete.
    deadline: Option<Instant>,
}

/// A frame's deadline is kept to within this (the socket's read timeout is lowered only when
/// what is left of the frame's time is this much shorter than it).
const DEADLINE_SLACK: Duration = Duration::from_millis(5);

impl Read for FrameReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if let Some(d) = self.deadline {
            let left = d.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(io::ErrorKind::TimedOut.into());
            }
            if left + DEADLINE_SLACK < self.timeout {
                self.stream.set_read_timeout(Some(left))?;
                self.timeout = left;
            }
        }
        let (n, fds) = recv_with_fds(&self.stream, buf)?;
        // A frame keeps its first few descriptors, in order; more are closed at once.
        let room = MAX_FDS.saturating_sub(self.fds.len());
        self.fds.extend(fds.into_iter().take(room));
        Ok(n)
    }
}

impl FrameReader {
    /// Back to waiting between frames: as long as the peer likes.
    fn idle(&mut self) -> io::Result<()> {
        self.deadline = None;
        if self.timeout != self.frame_timeout {
            self.stream.set_read_timeout(Some(self.frame_timeout))?;
            self.timeout = self.frame_timeout;
        }
        Ok(())
    }
}

/// Why a connection's read loop stopped reading.
enum Stop {
    /// The peer closed, the daemon is stopping, or the socket failed: nothing to say.
    Quiet,
    /// The peer gets this error, then the connection closes.
    Refuse(u64, Refusal),
}

/// Serves connection `stream` until it closes: registers it (unless the daemon holds its limit
/// of connections, or the peer's credentials are refused), runs its writer, reads and handles
/// its requests, then cleans up after it (its pending registration, sessions, pools and leases).
pub(crate) fn serve(shared: &Arc<Shared>, stream: UnixStream) {
    let id = shared.next_conn.fetch_add(1, Ordering::Relaxed);
    inc(&shared.metrics.connections);
    let timeout = shared.config.frame_timeout.max(Duration::from_millis(1));
    let (Ok(out), Ok(cred), Ok(()), Ok(())) = (
        stream.try_clone(),
        crate::peer::peer_cred(&stream),
        stream.set_read_timeout(Some(timeout)),
        stream.set_write_timeout(Some(
            shared.config.send_timeout.max(Duration::from_millis(1)),
        )),
    ) else {
        return;
    };
    let conn = Arc::new(Conn {
        id,
        outbox: Outbox {
            state: Mutex::new(OutState::default()),
            wake: Condvar::new(),
            stream: out,
            cap: shared.config.max_body as usize,
        },
        memory: Memory::new(shared.config.max_connection_bytes),
        publishes: shared.publishes.clone(),
        spare: Mutex::new(Spare::default()),
        register_request: AtomicU64::new(0),
    });
    let refusal = if !shared.config.peers.allows(&cred) {
        inc(&shared.metrics.refused_peers);
        tracing::warn!(
            uid = cred.uid,
            pid = cred.pid,
            "peer refused by credentials"
        );
        Some(Refusal::new(
            ErrorCode::NotPermitted,
            format!("user {} may not use this daemon", cred.uid),
        ))
    } else if !shared.admit(&conn) {
        inc(&shared.metrics.refused_connections);
        tracing::warn!(
            pid = cred.pid,
            limit = shared.config.max_connections,
            "connection refused: the daemon serves its limit of connections"
        );
        Some(Refusal::new(
            ErrorCode::LimitExceeded,
            format!(
                "the daemon serves at most {} connections; try again later",
                shared.config.max_connections
            ),
        ))
    } else {
        None
    };
    if let Some(r) = refusal {
        conn.outbox.send(0, &r.message());
        conn.outbox.close();
        return;
    }
    let writer = {
        let conn = conn.clone();
        std::thread::Builder::new()
            .name(format!("orbitkv-conn-{id}-writer"))
            .stack_size(128 << 10)
            .spawn(move || conn.outbox.drain())
            .ok()
    };
    if writer.is_none() || shared.stopping() {
        // Accepted while stopping (the stop may have closed the others already), or no thread.
        conn.outbox.close();
    } else {
        // A handler that panics ends this connection alone, and what it held is still freed
        // below: its writer, its sessions, pools and leases.
        let served = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            read_loop(shared, &conn, stream, timeout);
        }));
        if let Err(p) = served {
            let what = p
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            tracing::error!(
                conn = id,
                "a request handler panicked, closing the connection: {what}"
            );
            conn.outbox.close();
        }
        // Its last replies (a refusal, say) still go out, each within the send timeout; a stop
        // closes it at once.
        conn.outbox.finish();
    }
    if let Some(w) = writer {
        let _ = w.join();
    }
    if conn.outbox.was_slow() {
        inc(&shared.metrics.slow_peers);
    }
    shared.forget_conn(id);
}

/// Reads and handles `conn`'s requests until it closes or a frame is refused.
fn read_loop(shared: &Arc<Shared>, conn: &Arc<Conn>, stream: UnixStream, timeout: Duration) {
    let mut reader = FrameReader {
        stream,
        fds: Vec::new(),
        timeout,
        frame_timeout: timeout,
        deadline: None,
    };
    let stop = loop {
        let (header, body) = match read_frame(&mut reader, shared, conn) {
            Ok(f) => f,
            Err(s) => break s,
        };
        let msg = Message::decode(header.kind, &body);
        let fds = std::mem::take(&mut reader.fds);
        drop(body);
        let go_on = match msg {
            Ok(m) => super::handlers::handle(shared, conn, header.request, m, fds),
            Err(e) => {
                inc(&shared.metrics.malformed);
                conn.outbox.send(
                    header.request,
                    &Refusal::new(ErrorCode::Malformed, e.to_string()).message(),
                );
                false
            }
        };
        // The frame's memory, taken when its header arrived, is back once it is handled.
        conn.memory.release(u64::from(header.len));
        if !go_on || reader.idle().is_err() {
            break Stop::Quiet;
        }
    };
    if let Stop::Refuse(request, r) = stop {
        inc(&shared.metrics.malformed);
        conn.outbox.send(request, &r.message());
    }
}

/// Reads a frame: waits as long as it takes for its first byte, then at most the frame timeout
/// for the rest. The body's length is taken from the connection's memory before it is read;
/// the caller gives it back once the frame is handled.
fn read_frame(
    reader: &mut FrameReader,
    shared: &Shared,
    conn: &Conn,
) -> Result<(FrameHeader, Vec<u8>), Stop> {
    let timed_out = |shared: &Shared| {
        Stop::Refuse(
            0,
            Refusal::new(
                ErrorCode::Malformed,
                format!(
                    "frame incomplete after {} ms",
                    shared.config.frame_timeout.as_millis()
                ),
            ),
        )
    };
    let mut h = [0u8; HEADER_LEN];
    let mut got = 0;
    while got < h.len() {
        match reader.read(&mut h[got..]) {
            Ok(0) => return Err(Stop::Quiet),
            Ok(n) => {
                if got == 0 {
                    reader.deadline = Some(Instant::now() + reader.frame_timeout);
                }
                got += n;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if is_timeout(&e) && got == 0 => {
                if shared.stopping() || conn.outbox.is_closed() {
                    return Err(Stop::Quiet);
                }
            }
            Err(e) if is_timeout(&e) => return Err(timed_out(shared)),
            Err(_) => return Err(Stop::Quiet),
        }
    }
    let header = FrameHeader::decode(&h, shared.config.max_body)
        .map_err(|e| Stop::Refuse(0, Refusal::new(ErrorCode::Malformed, e.to_string())))?;
    if !conn.memory.reserve(u64::from(header.len)) {
        return Err(Stop::Refuse(
            header.request,
            Refusal::new(
                ErrorCode::LimitExceeded,
                format!(
                    "a frame of {} bytes would pass this connection's memory limit of {} bytes ({} held)",
                    header.len,
                    conn.memory.limit(),
                    conn.memory.used()
                ),
            ),
        ));
    }
    match read_body(reader, &header) {
        Ok(body) => Ok((header, body)),
        Err(e) => {
            conn.memory.release(u64::from(header.len));
            match e {
                ReadError::Io(e) if is_timeout(&e) => Err(timed_out(shared)),
                ReadError::Io(_) => Err(Stop::Quiet),
                ReadError::Protocol(p) => Err(Stop::Refuse(
                    header.request,
                    Refusal::new(ErrorCode::Malformed, p.to_string()),
                )),
            }
        }
    }
}

fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}
