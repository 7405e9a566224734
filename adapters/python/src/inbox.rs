//! The reading side of a connection: replies filed by request id, read leader/follower.
//!
//! A thread waiting for a reply reads the socket itself while no other thread reads it (the
//! leader), filing every reply it reads under its request's id and waking the others (the
//! followers), so a round trip costs no thread hop. A drainer thread reads what has arrived
//! every [`DRAIN_EVERY`] while nobody reads, so the daemon never finds the connection unread
//! (it disconnects a peer whose replies stay queued). Each request's replies are counted as
//! they are due, so a reply nobody will take is dropped, and a wait for a request with nothing
//! due ends at once. Pure Rust: no Python here.

use std::collections::{HashMap, HashSet, VecDeque};
use std::io;
use std::os::unix::net::UnixStream;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use orbitkv_protocol::frame::ReadError;
use orbitkv_protocol::{Message, read_frame};

use crate::fd_unsafe::readable;

/// How often the drainer reads what has arrived while nobody waits.
const DRAIN_EVERY: Duration = Duration::from_millis(10);

/// How long a wait with a deadline sleeps between returns to Python (so that Python signals get
/// through).
pub(crate) const READ_SLICE: Duration = Duration::from_millis(200);

/// Why a connection ended.
#[derive(Debug, Clone)]
pub(crate) enum Ended {
    /// The socket failed or the daemon closed it.
    Lost(String),
    /// The daemon sent bytes that are not a valid message.
    Violation(String),
    /// `close()` was called.
    Closed,
}

/// Why a wait ended without a reply.
#[derive(Debug)]
pub(crate) enum Unanswered {
    /// The deadline passed.
    TimedOut,
    /// No reply is due for the request (never sent, all taken, or forgotten).
    NotDue,
    /// The connection ended.
    Ended(Ended),
}

/// Replies filed so far, and what is still due.
#[derive(Default)]
pub(crate) struct Inbox {
    replies: HashMap<u64, VecDeque<Message>>,
    /// Replies still to arrive, by request.
    due: HashMap<u64, u8>,
    /// Requests whose replies are dropped on arrival.
    forgotten: HashSet<u64>,
    /// Why the connection ended, once it has.
    pub(crate) closed: Option<Ended>,
    /// A thread is reading the socket (the leader).
    reading: bool,
    /// The drainer stops.
    stopping: bool,
}

impl Inbox {
    /// `request` is about to be sent: `replies` replies will come for it.
    pub(crate) fn expect(&mut self, request: u64, replies: u8) {
        self.due.insert(request, replies);
    }

    /// `request` was not sent after all.
    pub(crate) fn unexpect(&mut self, request: u64) {
        self.due.remove(&request);
    }

    /// Drops `request`'s replies, those come and those to come.
    pub(crate) fn forget(&mut self, request: u64) {
        self.replies.remove(&request);
        if self.due.contains_key(&request) {
            self.forgotten.insert(request);
        }
    }

    fn take(&mut self, request: u64) -> Option<Message> {
        let q = self.replies.get_mut(&request)?;
        let m = q.pop_front();
        if q.is_empty() {
            self.replies.remove(&request);
        }
        m
    }

    fn file(&mut self, request: u64, m: Message) {
        let Some(due) = self.due.get_mut(&request) else {
            // Nothing is due for it: a reply to a request this client never sent.
            return;
        };
        // An Error is a request's last reply, whatever else was due.
        *due = if matches!(m, Message::Error { .. }) {
            0
        } else {
            due.saturating_sub(1)
        };
        if *due == 0 {
            self.due.remove(&request);
        }
        if self.forgotten.contains(&request) {
            if !self.due.contains_key(&request) {
                self.forgotten.remove(&request);
            }
            return;
        }
        self.replies.entry(request).or_default().push_back(m);
    }

    /// The next reply to `request` if one is filed; else why none can be waited for, if so.
    fn ready(&mut self, request: u64) -> Option<Result<Message, Unanswered>> {
        if let Some(m) = self.take(request) {
            return Some(Ok(m));
        }
        if let Some(e) = &self.closed {
            return Some(Err(Unanswered::Ended(e.clone())));
        }
        if !self.due.contains_key(&request) || self.forgotten.contains(&request) {
            return Some(Err(Unanswered::NotDue));
        }
        None
    }
}

/// The reading side, shared by every thread of the connection and its drainer.
pub(crate) struct Shared {
    inbox: Mutex<Inbox>,
    /// A reply was filed, a leader gave up reading, or the connection ended.
    arrived: Condvar,
    /// The drainer's timer (woken early only to stop).
    tick: Condvar,
    /// The socket (a clone of the sender's), read only by the leader.
    stream: UnixStream,
    max_body: u32,
}

impl Shared {
    /// The reading side of `stream` (its reads block: no receive timeout).
    pub(crate) fn new(stream: UnixStream, max_body: u32) -> io::Result<Self> {
        stream.set_read_timeout(None)?;
        Ok(Self {
            inbox: Mutex::new(Inbox::default()),
            arrived: Condvar::new(),
            tick: Condvar::new(),
            stream,
            max_body,
        })
    }

    pub(crate) fn inbox(&self) -> MutexGuard<'_, Inbox> {
        self.inbox.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Ends the connection for `why` (the first reason sticks): the socket is shut down, every
    /// waiter and the drainer wake.
    pub(crate) fn end(&self, why: Ended) {
        // The reason first: a leader woken by the shutdown must not record its own.
        {
            let mut inbox = self.inbox();
            inbox.closed.get_or_insert(why);
            inbox.stopping = true;
        }
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
        self.tick.notify_all();
        self.arrived.notify_all();
    }

    /// Reads one frame as the leader, once the socket is readable within `wait` (`None`: no
    /// limit): `Ok(None)` when nothing came in time. Without a limit the read itself waits: it
    /// wakes faster on a reply than a sleep in poll(2) with a timer does.
    fn read_one(&self, wait: Option<Duration>) -> Result<Option<(u64, Message)>, Ended> {
        if wait.is_some() {
            match readable(&self.stream, wait) {
                Ok(false) => return Ok(None),
                Ok(true) => {}
                Err(e) => return Err(Ended::Lost(format!("connection: {e}"))),
            }
        }
        // Once a frame's first byte is in, its rest is read however long it takes (the daemon
        // writes whole frames).
        let (h, body) = read_frame(&mut &self.stream, self.max_body).map_err(|e| match e {
            ReadError::Io(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                Ended::Lost("the daemon closed the connection".to_owned())
            }
            ReadError::Io(e) => Ended::Lost(format!("connection: {e}")),
            ReadError::Protocol(e) => Ended::Violation(format!("protocol: {e}")),
        })?;
        let m = Message::decode(h.kind, &body)
            .map_err(|e| Ended::Violation(format!("protocol: {e}")))?;
        if h.request == 0 {
            // A connection-level error: the daemon closes the connection after it.
            return Err(match m {
                Message::Error { code, detail, .. } => Ended::Lost(format!(
                    "the daemon ended the connection ({}): {detail}",
                    code.name()
                )),
                other => Ended::Violation(format!(
                    "an unrequested message of type {:#06x}",
                    other.kind()
                )),
            });
        }
        Ok(Some((h.request, m)))
    }

    /// Files what one read as the leader gave, gives leadership up and wakes everyone.
    fn after_read(&self, read: Result<Option<(u64, Message)>, Ended>) -> MutexGuard<'_, Inbox> {
        let mut inbox = self.inbox();
        inbox.reading = false;
        match read {
            Ok(Some((r, m))) => inbox.file(r, m),
            Ok(None) => {}
            Err(why) => {
                inbox.closed.get_or_insert(why);
            }
        }
        self.arrived.notify_all();
        inbox
    }

    /// The next reply to `request`, waiting until `until` (`None`: no limit), reading the
    /// socket as the leader whenever no other thread does. Call without the GIL.
    pub(crate) fn wait(&self, request: u64, until: Option<Instant>) -> Result<Message, Unanswered> {
        let mut inbox = self.inbox();
        loop {
            if let Some(done) = inbox.ready(request) {
                return done;
            }
            let left = until.map(|u| u.saturating_duration_since(Instant::now()));
            if left.is_some_and(|l| l.is_zero()) {
                return Err(Unanswered::TimedOut);
            }
            if !inbox.reading {
                inbox.reading = true;
                drop(inbox);
                let read = self.read_one(left);
                inbox = self.after_read(read);
                continue;
            }
            inbox = match left {
                None => self.arrived.wait(inbox).unwrap_or_else(|e| e.into_inner()),
                Some(l) => {
                    self.arrived
                        .wait_timeout(inbox, l)
                        .unwrap_or_else(|e| e.into_inner())
                        .0
                }
            };
        }
    }

    /// The next reply to `request` if one has come (reading what has arrived when no other
    /// thread reads), else `Ok(None)`. Call without the GIL.
    pub(crate) fn poll(&self, request: u64) -> Result<Option<Message>, Unanswered> {
        let mut inbox = self.inbox();
        if !inbox.replies.contains_key(&request) && !inbox.reading && inbox.closed.is_none() {
            inbox.reading = true;
            drop(inbox);
            inbox = self.drain();
        }
        match inbox.ready(request) {
            Some(done) => done.map(Some),
            None => Ok(None),
        }
    }

    /// As the leader (taken by the caller), files every frame already readable, each as it is
    /// read; returns with leadership given up.
    fn drain(&self) -> MutexGuard<'_, Inbox> {
        loop {
            let read = self.read_one(Some(Duration::ZERO));
            let more = matches!(read, Ok(Some(_)));
            let mut inbox = self.after_read(read);
            if !more {
                return inbox;
            }
            inbox.reading = true;
        }
    }

    /// The drainer: while the connection is open, reads what has arrived whenever nobody else
    /// is reading, every [`DRAIN_EVERY`].
    pub(crate) fn drainer(&self) {
        let mut inbox = self.inbox();
        loop {
            if inbox.stopping || inbox.closed.is_some() {
                return;
            }
            inbox = self
                .tick
                .wait_timeout(inbox, DRAIN_EVERY)
                .unwrap_or_else(|e| e.into_inner())
                .0;
            if inbox.reading || inbox.stopping || inbox.closed.is_some() {
                continue;
            }
            inbox.reading = true;
            drop(inbox);
            inbox = self.drain();
        }
    }
}
