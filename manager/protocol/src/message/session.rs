//! The session messages: Hello and Welcome open a connection; Register and Sealed join a rank
//! to its instance.

use orbitkv_state::{HashDomain, Rule};

use super::fields::{name, read_name};
use super::{Body, Message, Token};
use crate::error::{ProtocolError, Result};
use crate::wire::{Reader, Writer};

/// Which part of an engine instance a session is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The scheduler: queries, acquires, releases.
    Scheduler,
    /// A worker rank: registers pools, loads, publishes.
    Worker,
}

/// A rank's registration. The instance seals once its scheduler and every declared worker have
/// registered and agree on identity, layout, scope and shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Register {
    /// The engine instance's name, shared by its scheduler and workers.
    pub instance: String,
    /// Scheduler or worker.
    pub role: Role,
    /// The worker's rank (0 for the scheduler).
    pub rank: u32,
    /// Worker ranks the instance declares.
    pub workers: u32,
    /// The computation identity digest.
    pub identity: [u8; 32],
    /// The model's name or directory, for operators (`inspect`); not part of the identity.
    pub model: String,
    /// Its hub revision or artifacts digest, for operators.
    pub revision: String,
    /// The engine's prefix-hash scheme.
    pub domain: HashDomain,
    /// The instance's storage layout, in its canonical encoding (docs/format.md).
    pub layout: Vec<u8>,
    /// The recovery rule of each cache group.
    pub rules: Vec<(u32, Rule)>,
    /// The cache scope; empty for none.
    pub scope: String,
    /// This rank's state format of each cache group, in the layout's group order, each in its
    /// canonical encoding (none for the scheduler).
    pub formats: Vec<Vec<u8>>,
    /// How long the daemon waits for the other ranks before refusing the seal.
    pub seal_timeout_ms: u32,
    /// The instance has no scheduler process (SGLang): its round seals once workers
    /// `0 … workers−1` have registered.
    pub no_scheduler: bool,
}

/// Register flags (a `u8`): bit 0, the instance has no scheduler.
const REGISTER_NO_SCHEDULER: u8 = 1;

/// The most rules or formats a Register carries: one per cache group of a layout.
const MAX_REGISTER_GROUPS: usize = orbitkv_state::layout::MAX_GROUPS;

impl Register {
    /// The bytes a daemon holds for this registration while its round waits (its decoded
    /// fields and their allocations), at least.
    pub fn held_bytes(&self) -> u64 {
        let vec = size_of::<Vec<u8>>();
        let heap = self.instance.len()
            + self.model.len()
            + self.revision.len()
            + self.layout.len()
            + self.scope.len()
            + self.rules.len() * size_of::<(u32, Rule)>()
            + self.formats.iter().map(|f| f.len() + vec).sum::<usize>();
        (size_of::<Self>() + heap) as u64
    }
}

impl Body for Register {
    fn encode(&self, w: &mut Writer) {
        let g = self;
        name(w, &g.instance);
        w.u8(match g.role {
            Role::Scheduler => 0,
            Role::Worker => 1,
        })
        .u32(g.rank)
        .u32(g.workers)
        .raw(&g.identity);
        name(w, &g.model);
        name(w, &g.revision);
        w.u8(g.domain.code())
            .bytes32(&g.layout)
            .u32(g.rules.len() as u32);
        for (group, rule) in &g.rules {
            let (k, param) = match rule {
                Rule::Prefix => (0, 0),
                Rule::Window { tokens } => (1, *tokens),
                Rule::Checkpoint { grid } => (2, *grid),
                Rule::Undefined => (3, 0),
            };
            w.u32(*group).u8(k).u64(param);
        }
        name(w, &g.scope);
        w.u32(g.formats.len() as u32);
        for f in &g.formats {
            w.bytes32(f);
        }
        w.u32(g.seal_timeout_ms).u8(if g.no_scheduler {
            REGISTER_NO_SCHEDULER
        } else {
            0
        });
    }

    fn decode(r: &mut Reader<'_>) -> Result<Self> {
        let instance = read_name(r, "instance")?;
        if instance.is_empty() {
            return Err(ProtocolError::BadField {
                what: "instance",
                why: "empty".into(),
            });
        }
        let role = match r.u8("role")? {
            0 => Role::Scheduler,
            1 => Role::Worker,
            x => {
                return Err(ProtocolError::BadField {
                    what: "role",
                    why: format!("unknown role {x}"),
                });
            }
        };
        let rank = r.u32("rank")?;
        let workers = r.u32("workers")?;
        let identity = r.array("identity")?;
        let model = read_name(r, "model")?;
        let revision = read_name(r, "revision")?;
        let domain =
            HashDomain::from_code(r.u8("hash domain")?).map_err(|e| ProtocolError::BadField {
                what: "hash domain",
                why: e.to_string(),
            })?;
        let layout = r.bytes32("layout")?.to_vec();
        let n = r.count("rules", 13)?;
        if n > MAX_REGISTER_GROUPS {
            return Err(ProtocolError::BadField {
                what: "rules",
                why: format!("{n} rules, more than {MAX_REGISTER_GROUPS} cache groups"),
            });
        }
        let mut rules = Vec::with_capacity(n);
        for _ in 0..n {
            let group = r.u32("rule group")?;
            let k = r.u8("rule")?;
            let param = r.u64("rule parameter")?;
            let rule = match k {
                0 => Rule::Prefix,
                1 => Rule::Window { tokens: param },
                2 => Rule::Checkpoint { grid: param },
                3 => Rule::Undefined,
                x => {
                    return Err(ProtocolError::BadField {
                        what: "rule",
                        why: format!("unknown rule {x}"),
                    });
                }
            };
            if matches!(rule, Rule::Prefix | Rule::Undefined) && param != 0 {
                return Err(ProtocolError::BadField {
                    what: "rule parameter",
                    why: "nonzero for a rule without one".into(),
                });
            }
            rules.push((group, rule));
        }
        Ok(Register {
            instance,
            role,
            rank,
            workers,
            identity,
            model,
            revision,
            domain,
            layout,
            rules,
            scope: read_name(r, "scope")?,
            formats: {
                let n = r.count("formats", 4)?;
                if n > MAX_REGISTER_GROUPS {
                    return Err(ProtocolError::BadField {
                        what: "formats",
                        why: format!("{n} formats, more than {MAX_REGISTER_GROUPS} cache groups"),
                    });
                }
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push(r.bytes32("format")?.to_vec());
                }
                v
            },
            seal_timeout_ms: r.u32("seal timeout")?,
            no_scheduler: match r.u8("register flags")? {
                0 => false,
                REGISTER_NO_SCHEDULER => true,
                x => {
                    return Err(ProtocolError::BadField {
                        what: "register flags",
                        why: format!("unknown bits {x:#04x}"),
                    });
                }
            },
        })
    }
}

pub(super) fn encode_hello(w: &mut Writer, client: &str, pid: u32) {
    name(w, client);
    w.u32(pid);
}

pub(super) fn decode_hello(r: &mut Reader<'_>) -> Result<Message> {
    Ok(Message::Hello {
        client: read_name(r, "client name")?,
        pid: r.u32("pid")?,
    })
}

pub(super) fn encode_welcome(w: &mut Writer, server: &str, max_body: u32) {
    name(w, server);
    w.u32(max_body);
}

pub(super) fn decode_welcome(r: &mut Reader<'_>) -> Result<Message> {
    Ok(Message::Welcome {
        server: read_name(r, "server")?,
        max_body: r.u32("max body")?,
    })
}

pub(super) fn encode_sealed(
    w: &mut Writer,
    session: u64,
    epoch: u64,
    namespace: &[u8; 32],
    token: &Token,
) {
    w.u64(session).u64(epoch).raw(namespace).raw(token);
}

pub(super) fn decode_sealed(r: &mut Reader<'_>) -> Result<Message> {
    Ok(Message::Sealed {
        session: r.u64("session")?,
        epoch: r.u64("epoch")?,
        namespace: r.array("namespace")?,
        token: r.array("token")?,
    })
}
