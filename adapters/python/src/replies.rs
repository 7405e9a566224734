//! What a reply becomes in Python: `Sealed`, `PoolRegistered`, `Proof` (with its
//! `ProofLoad`s), `Miss`, `Leased`, `Pages` (a Load's or a Publish's statuses) and `Done`.

use pyo3::prelude::*;
use pyo3::types::PyBytes;

use orbitkv_protocol::message::{Proof as WireProof, Token};
use orbitkv_protocol::{Message, PageStatus};

use crate::errors::{refused, violation};

/// What `wait` and `poll` return, by reply.
pub(crate) fn to_python(py: Python<'_>, m: Message) -> PyResult<Py<PyAny>> {
    let obj: Py<PyAny> = match m {
        Message::Sealed {
            session,
            epoch,
            namespace,
            token,
        } => Py::new(
            py,
            Sealed {
                session,
                epoch,
                namespace,
                token,
            },
        )?
        .into_any(),
        Message::PoolRegistered { pool } => {
            Py::new(py, PoolRegistered { pool: pool.0 })?.into_any()
        }
        Message::Proof(p) => Py::new(py, Proof::from(p))?.into_any(),
        Message::Miss { reason, detail } => Py::new(py, Miss::new(reason, detail))?.into_any(),
        Message::Leased {
            lease,
            ttl_ms,
            proof,
        } => Py::new(
            py,
            Leased {
                lease,
                ttl_ms,
                proof: Proof::from(proof),
            },
        )?
        .into_any(),
        Message::Loaded { pages } => Py::new(py, Pages::new("loaded", &pages, 0))?.into_any(),
        Message::PublishCopied { pages } => {
            Py::new(py, Pages::new("copied", &pages, 0))?.into_any()
        }
        Message::PublishDurable {
            pages,
            retry_after_ms,
        } => Py::new(py, Pages::new("durable", &pages, retry_after_ms))?.into_any(),
        Message::Released => Py::new(py, Done::new("released"))?.into_any(),
        Message::Synced => Py::new(py, Done::new("synced"))?.into_any(),
        Message::StatsReply { text } => text.into_pyobject(py)?.into_any().unbind(),
        Message::Error {
            code,
            retry_after_ms,
            detail,
        } => return Err(refused(py, code, retry_after_ms, &detail)),
        other => {
            return Err(violation(
                py,
                format!("a reply of type {:#06x} no request takes", other.kind()),
            ));
        }
    };
    Ok(obj)
}

/// A rank's seal: its session id, the instance's epoch and namespace, and the token every
/// hot-path request carries.
#[pyclass(frozen, module = "orbitkv._native")]
pub struct Sealed {
    session: u64,
    epoch: u64,
    namespace: [u8; 32],
    token: Token,
}

#[pymethods]
impl Sealed {
    /// This rank's session id.
    #[getter]
    fn session(&self) -> u64 {
        self.session
    }

    /// The instance's epoch.
    #[getter]
    fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The instance's namespace (32 bytes).
    #[getter]
    fn namespace<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.namespace)
    }

    /// The session token every hot-path request carries (32 bytes).
    #[getter]
    fn token<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.token)
    }

    fn __repr__(&self) -> String {
        format!("Sealed(session={}, epoch={})", self.session, self.epoch)
    }
}

/// A pool registered.
#[pyclass(frozen, module = "orbitkv._native", get_all)]
pub struct PoolRegistered {
    /// The pool's id.
    pub pool: u32,
}

/// The records to load for one group and rank: block indices into the query's hash list.
#[pyclass(frozen, module = "orbitkv._native", get_all)]
#[derive(Clone)]
pub struct ProofLoad {
    /// The cache group.
    pub group: u32,
    /// The rank (`0xFFFFFFFF`: replicated).
    pub rank: u32,
    /// Block indices, in token order.
    pub blocks: Vec<u32>,
}

/// A proven restorable boundary and what to load for it.
#[pyclass(frozen, module = "orbitkv._native", get_all)]
#[derive(Clone)]
pub struct Proof {
    /// Tokens up to here can be restored.
    pub boundary: u64,
    /// What to load, per group and rank.
    pub loads: Vec<ProofLoad>,
}

impl From<WireProof> for Proof {
    fn from(p: WireProof) -> Self {
        Self {
            boundary: p.boundary,
            loads: p
                .loads
                .into_iter()
                .map(|l| ProofLoad {
                    group: l.group,
                    rank: l.rank,
                    blocks: l.blocks,
                })
                .collect(),
        }
    }
}

#[pymethods]
impl Proof {
    fn __repr__(&self) -> String {
        format!(
            "Proof(boundary={}, loads={})",
            self.boundary,
            self.loads.len()
        )
    }
}

/// Nothing beyond the origin can be restored, and why (docs/protocol.md, "Miss reasons").
#[pyclass(frozen, module = "orbitkv._native", get_all)]
pub struct Miss {
    /// The reason's code.
    pub reason: u16,
    /// The reason's name.
    pub reason_name: Option<&'static str>,
    /// A readable account.
    pub detail: String,
}

impl Miss {
    fn new(reason: u16, detail: String) -> Self {
        Self {
            reason,
            reason_name: orbitkv_protocol::miss::miss_reason_name(reason),
            detail,
        }
    }
}

#[pymethods]
impl Miss {
    fn __repr__(&self) -> String {
        format!("Miss({:?}, {:?})", self.reason_name, self.detail)
    }
}

/// The proven records are pinned under a lease.
#[pyclass(frozen, module = "orbitkv._native", get_all)]
pub struct Leased {
    /// The lease.
    pub lease: u64,
    /// It ends this long after its last use unless released.
    pub ttl_ms: u32,
    /// What was proven and pinned.
    pub proof: Proof,
}

#[pymethods]
impl Leased {
    fn __repr__(&self) -> String {
        format!(
            "Leased(lease={}, boundary={})",
            self.lease, self.proof.boundary
        )
    }
}

/// Per-page statuses of a Load (`kind` "loaded"), or of a Publish once copied ("copied") or
/// durable ("durable", with `retry_after` seconds for pages to send again later).
#[pyclass(frozen, module = "orbitkv._native", get_all)]
pub struct Pages {
    /// "loaded", "copied" or "durable".
    pub kind: &'static str,
    /// Each page's status, in request order (`ok`, `stale_generation`, ...).
    pub statuses: Vec<&'static str>,
    /// Seconds to wait before publishing `retry_later` pages again.
    pub retry_after: f64,
}

impl Pages {
    fn new(kind: &'static str, pages: &[PageStatus], retry_after_ms: u32) -> Self {
        Self {
            kind,
            statuses: pages.iter().map(|p| p.name()).collect(),
            retry_after: f64::from(retry_after_ms) / 1000.0,
        }
    }
}

#[pymethods]
impl Pages {
    /// Whether every page is `ok`.
    #[getter]
    fn all_ok(&self) -> bool {
        self.statuses.iter().all(|s| *s == "ok")
    }

    fn __repr__(&self) -> String {
        format!("Pages({:?}, {:?})", self.kind, self.statuses)
    }
}

/// A request done: "released" or "synced".
#[pyclass(frozen, module = "orbitkv._native", get_all)]
pub struct Done {
    /// What was done.
    pub kind: &'static str,
}

impl Done {
    fn new(kind: &'static str) -> Self {
        Self { kind }
    }
}
