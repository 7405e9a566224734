//! The Rust client of the engine protocol: one connection, requests answered in order. Used by
//! the tests, the simulated engine and the engine adapters.

use std::io::{self, Write};
use std::os::fd::BorrowedFd;
use std::os::unix::net::UnixStream;
use std::path::Path;

use orbitkv_gpu_bridge::fdpass::send_with_fd;

use crate::protocol::frame::ReadError;
use crate::protocol::{DEFAULT_MAX_BODY, ErrorCode, Message, ProtocolError, read_frame};

/// Why a request failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The connection failed or closed.
    #[error("connection: {0}")]
    Io(#[from] io::Error),
    /// The daemon sent bytes that are not a valid message.
    #[error("protocol: {0}")]
    Protocol(#[from] ProtocolError),
    /// The daemon refused the request.
    #[error("refused ({code:?}): {detail}")]
    Refused {
        /// Why.
        code: ErrorCode,
        /// What exactly.
        detail: String,
    },
    /// A reply of a type the request does not take.
    #[error("unexpected reply of type {0:#06x}")]
    Unexpected(u16),
}

impl From<ReadError> for ClientError {
    fn from(e: ReadError) -> Self {
        match e {
            ReadError::Io(e) => ClientError::Io(e),
            ReadError::Protocol(e) => ClientError::Protocol(e),
        }
    }
}

/// A connection to the daemon.
pub struct Client {
    stream: UnixStream,
    next: u64,
    max_body: u32,
}

impl Client {
    /// Connects to the daemon's socket.
    pub fn connect(path: &Path) -> Result<Self, ClientError> {
        Ok(Self {
            stream: UnixStream::connect(path)?,
            next: 1,
            max_body: DEFAULT_MAX_BODY,
        })
    }

    /// Sends `m`; returns its request id.
    pub fn send(&mut self, m: &Message) -> Result<u64, ClientError> {
        let id = self.next;
        self.next += 1;
        self.stream.write_all(&m.encode_frame(id)?)?;
        Ok(id)
    }

    /// Sends `m` with a descriptor beside it (a pool's region).
    pub fn send_with_fd(&mut self, m: &Message, fd: BorrowedFd<'_>) -> Result<u64, ClientError> {
        let id = self.next;
        self.next += 1;
        send_with_fd(&self.stream, &m.encode_frame(id)?, fd)?;
        Ok(id)
    }

    /// Reads the next reply (to `request`); an `Error` reply is [`ClientError::Refused`].
    pub fn reply(&mut self, request: u64) -> Result<Message, ClientError> {
        loop {
            let (h, body) = read_frame(&mut self.stream, self.max_body)?;
            let m = Message::decode(h.kind, &body)?;
            if h.request != request && h.request != 0 {
                // A late reply to an earlier request (a second Publish reply): skip it.
                continue;
            }
            if let Message::Error { code, detail } = m {
                return Err(ClientError::Refused { code, detail });
            }
            return Ok(m);
        }
    }

    /// Sends `m` and waits for its reply.
    pub fn request(&mut self, m: &Message) -> Result<Message, ClientError> {
        let id = self.send(m)?;
        self.reply(id)
    }

    /// Says hello; returns the daemon's version and body limit.
    pub fn hello(&mut self, name: &str) -> Result<(String, u32), ClientError> {
        match self.request(&Message::Hello {
            client: name.to_owned(),
            pid: std::process::id(),
        })? {
            Message::Welcome { server, max_body } => {
                self.max_body = max_body.max(DEFAULT_MAX_BODY);
                Ok((server, max_body))
            }
            other => Err(ClientError::Unexpected(other.kind())),
        }
    }

    /// The daemon's metrics text.
    pub fn stats(&mut self) -> Result<String, ClientError> {
        match self.request(&Message::Stats)? {
            Message::StatsReply { text } => Ok(text),
            other => Err(ClientError::Unexpected(other.kind())),
        }
    }

    /// The raw stream (tests send garbage through it).
    pub fn stream(&mut self) -> &mut UnixStream {
        &mut self.stream
    }
}
