//! The Rust client of the engine protocol: one connection, requests answered in order, a typed
//! method per request (register, register_pool, query, acquire, load, publish, release, stats,
//! sync, retire). Used by the tests, the simulated engine, `orbitkv admin`, the benchmarks and
//! the engine adapters.

use std::collections::VecDeque;
use std::io::{self, Write};
use std::os::fd::BorrowedFd;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use orbitkv_gpu_bridge::fdpass::send_with_fds;

use orbitkv_gpu_bridge::{PageMemory, PoolId, PoolSpec};

use crate::frame::ReadError;
use crate::message::{LoadRequest, Proof, PublishRequest, QueryRequest, Register, Token};
use crate::{DEFAULT_MAX_BODY, ErrorCode, Message, PageStatus, ProtocolError, read_frame};

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
        /// For [`ErrorCode::RetryLater`], how long to wait before sending it again.
        retry_after: Duration,
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

/// What a rank's registration got when its instance sealed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seal {
    /// This rank's session id.
    pub session: u64,
    /// The instance's epoch.
    pub epoch: u64,
    /// The instance's namespace.
    pub namespace: [u8; 32],
    /// The token every hot-path request carries.
    pub token: Token,
}

/// A Query's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// What can be restored, and what to load for it.
    Proof(Proof),
    /// Nothing beyond the origin, and why (docs/protocol.md, "Miss reasons").
    Miss {
        /// The reason's code.
        reason: u16,
        /// A readable account.
        detail: String,
    },
}

/// A Publish's final reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Durable {
    /// Each page's final status, in request order: `Ok` for each stored, durable record.
    pub pages: Vec<PageStatus>,
    /// For pages with status [`PageStatus::RetryLater`], how long the store asks to wait
    /// before they are published again.
    pub retry_after: Duration,
}

/// An Acquire's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Acquired {
    /// The proven records are pinned under `lease`.
    Leased {
        /// The lease.
        lease: u64,
        /// It ends this long after its last use unless released.
        ttl_ms: u32,
        /// What was proven.
        proof: Proof,
    },
    /// Nothing beyond the origin, and why.
    Miss {
        /// The reason's code.
        reason: u16,
        /// A readable account.
        detail: String,
    },
}

/// Replies kept for requests nobody has asked for yet, at most.
const EARLY_REPLIES: usize = 1024;

/// A connection to the daemon. Replies may arrive out of request order (a Publish's second
/// reply comes when its records are durable, possibly after the replies to later requests):
/// each is matched to its request by id, and one read while waiting for another is kept.
pub struct Client {
    stream: UnixStream,
    next: u64,
    max_body: u32,
    /// Replies that arrived while another was awaited, oldest first.
    early: VecDeque<(u64, Message)>,
}

impl Client {
    /// Connects to the daemon's socket.
    pub fn connect(path: &Path) -> Result<Self, ClientError> {
        Ok(Self {
            stream: UnixStream::connect(path)?,
            next: 1,
            max_body: DEFAULT_MAX_BODY,
            early: VecDeque::new(),
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
        self.send_with_fds(m, &[fd])
    }

    /// Sends `m` with descriptors beside it, in order (a pool in memory the engine allocated:
    /// its states-only region, then its page memory).
    pub fn send_with_fds(
        &mut self,
        m: &Message,
        fds: &[BorrowedFd<'_>],
    ) -> Result<u64, ClientError> {
        let id = self.next;
        self.next += 1;
        send_with_fds(&self.stream, &m.encode_frame(id)?, fds)?;
        Ok(id)
    }

    /// The next reply to `request` (or to no request in particular: a connection-level error);
    /// an `Error` reply is [`ClientError::Refused`]. Replies to other requests that arrive
    /// meanwhile are kept for them.
    pub fn reply(&mut self, request: u64) -> Result<Message, ClientError> {
        loop {
            let m = match self.early.iter().position(|(r, _)| *r == request) {
                Some(i) => match self.early.remove(i) {
                    Some((_, m)) => m,
                    None => continue,
                },
                None => {
                    let (h, body) = read_frame(&mut self.stream, self.max_body)?;
                    let m = Message::decode(h.kind, &body)?;
                    if h.request != request && h.request != 0 {
                        if self.early.len() == EARLY_REPLIES {
                            self.early.pop_front();
                        }
                        self.early.push_back((h.request, m));
                        continue;
                    }
                    m
                }
            };
            if let Message::Error {
                code,
                retry_after_ms,
                detail,
            } = m
            {
                return Err(ClientError::Refused {
                    code,
                    retry_after: Duration::from_millis(u64::from(retry_after_ms)),
                    detail,
                });
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

    /// Registers a rank; returns once its instance sealed (or the seal was refused or timed
    /// out: [`ClientError::Refused`] with the reason).
    pub fn register(&mut self, reg: Register) -> Result<Seal, ClientError> {
        let id = self.register_nowait(reg)?;
        self.await_seal(id)
    }

    /// Sends a rank's Register without waiting for its seal (a vLLM worker registers minutes
    /// before its scheduler exists); [`Client::await_seal`] with the id it returns waits for
    /// it. Other requests on the connection may be sent meanwhile.
    pub fn register_nowait(&mut self, reg: Register) -> Result<u64, ClientError> {
        self.send(&Message::Register(reg))
    }

    /// Waits for the seal of the Register sent as request `id`.
    pub fn await_seal(&mut self, id: u64) -> Result<Seal, ClientError> {
        match self.reply(id)? {
            Message::Sealed {
                session,
                epoch,
                namespace,
                token,
            } => Ok(Seal {
                session,
                epoch,
                namespace,
                token,
            }),
            other => Err(ClientError::Unexpected(other.kind())),
        }
    }

    /// Registers a worker's page pool, its region's descriptor passed beside the frame: a host
    /// pool's pages, or (with [`PageMemory::Device`]) a device pool's state words.
    pub fn register_pool(
        &mut self,
        token: Token,
        spec: PoolSpec,
        memory: PageMemory,
        region: BorrowedFd<'_>,
    ) -> Result<(), ClientError> {
        let id = self.send_with_fd(
            &Message::RegisterPool {
                token,
                spec,
                memory,
            },
            region,
        )?;
        match self.reply(id)? {
            Message::PoolRegistered { .. } => Ok(()),
            other => Err(ClientError::Unexpected(other.kind())),
        }
    }

    /// Registers a worker's page pool whose pages are in memory the engine allocated itself
    /// (SGLang's `allocator: shm`): `states`, a states-only region, and `memory`, holding the
    /// pages from `offset`, passed beside the frame in that order.
    pub fn register_engine_memory_pool(
        &mut self,
        token: Token,
        spec: PoolSpec,
        offset: u64,
        states: BorrowedFd<'_>,
        memory: BorrowedFd<'_>,
    ) -> Result<(), ClientError> {
        let id = self.send_with_fds(
            &Message::RegisterPool {
                token,
                spec,
                memory: PageMemory::Engine { offset },
            },
            &[states, memory],
        )?;
        match self.reply(id)? {
            Message::PoolRegistered { .. } => Ok(()),
            other => Err(ClientError::Unexpected(other.kind())),
        }
    }

    /// Ends pool `pool`'s registration; returns once the daemon has let go of its memory (no
    /// copy touches it, a device pool's mapping is closed), so the engine may free it.
    pub fn unregister_pool(&mut self, token: Token, pool: PoolId) -> Result<(), ClientError> {
        match self.request(&Message::UnregisterPool { token, pool })? {
            Message::PoolUnregistered { .. } => Ok(()),
            other => Err(ClientError::Unexpected(other.kind())),
        }
    }

    /// Asks what can be restored (no side effects).
    pub fn query(&mut self, q: QueryRequest) -> Result<Answer, ClientError> {
        match self.request(&Message::Query(q))? {
            Message::Proof(proof) => Ok(Answer::Proof(proof)),
            Message::Miss { reason, detail } => Ok(Answer::Miss { reason, detail }),
            other => Err(ClientError::Unexpected(other.kind())),
        }
    }

    /// Asks what can be restored and pins it under a lease.
    pub fn acquire(&mut self, q: QueryRequest) -> Result<Acquired, ClientError> {
        match self.request(&Message::Acquire(q))? {
            Message::Leased {
                lease,
                ttl_ms,
                proof,
            } => Ok(Acquired::Leased {
                lease,
                ttl_ms,
                proof,
            }),
            Message::Miss { reason, detail } => Ok(Acquired::Miss { reason, detail }),
            other => Err(ClientError::Unexpected(other.kind())),
        }
    }

    /// Copies acquired records into pages; one status per page.
    pub fn load(&mut self, req: LoadRequest) -> Result<Vec<PageStatus>, ClientError> {
        match self.request(&Message::Load(req))? {
            Message::Loaded { pages } => Ok(pages),
            other => Err(ClientError::Unexpected(other.kind())),
        }
    }

    /// Sends a Publish; `copied` is called with the first reply's statuses as soon as it comes
    /// (the pages may be reused from then on). Returns each page's final status once the
    /// records are durable.
    pub fn publish(
        &mut self,
        req: PublishRequest,
        copied: impl FnOnce(&[PageStatus]),
    ) -> Result<Durable, ClientError> {
        let id = self.send(&Message::Publish(req))?;
        match self.reply(id)? {
            Message::PublishCopied { pages } => copied(&pages),
            other => return Err(ClientError::Unexpected(other.kind())),
        }
        match self.reply(id)? {
            Message::PublishDurable {
                pages,
                retry_after_ms,
            } => Ok(Durable {
                pages,
                retry_after: Duration::from_millis(u64::from(retry_after_ms)),
            }),
            other => Err(ClientError::Unexpected(other.kind())),
        }
    }

    /// Ends a lease.
    pub fn release(&mut self, token: Token, lease: u64) -> Result<(), ClientError> {
        match self.request(&Message::Release { token, lease })? {
            Message::Released => Ok(()),
            other => Err(ClientError::Unexpected(other.kind())),
        }
    }

    /// Makes every accepted publish durable.
    pub fn sync(&mut self) -> Result<(), ClientError> {
        match self.request(&Message::Sync)? {
            Message::Synced => Ok(()),
            other => Err(ClientError::Unexpected(other.kind())),
        }
    }

    /// Retires a namespace; returns the watermark below which its records are dead.
    pub fn retire(&mut self, namespace: [u8; 32]) -> Result<u64, ClientError> {
        match self.request(&Message::Retire { namespace })? {
            Message::Retired { watermark } => Ok(watermark),
            other => Err(ClientError::Unexpected(other.kind())),
        }
    }

    /// The raw stream (tests send garbage through it).
    pub fn stream(&mut self) -> &mut UnixStream {
        &mut self.stream
    }
}
