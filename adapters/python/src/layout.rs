//! Storage layouts, state formats and pool geometry: described in Python, validated and
//! encoded by the state crate and the bridge, so their canonical bytes and digests are the
//! daemon's.

use pyo3::prelude::*;
use pyo3::types::PyBytes;

use orbitkv_gpu_bridge::{GroupGeometry as Geometry, PoolId, PoolSpec as Spec};
use orbitkv_state::{
    Axis, CacheGroupId, CacheGroupSpec, Component, Dim, EngineKind, HeadShape, ImplTag, Label,
    ParallelShape, RankSpec, Rule, StateFormat as Format, StorageLayout as Layout,
};

use crate::errors::invalid;

/// A setting's value as a label (what identities and formats are made of).
pub(crate) fn label(py: Python<'_>, what: &'static str, v: &str) -> PyResult<Label> {
    Label::new(what, v).map_err(|e| invalid(py, e.to_string()))
}

/// An engine's name (`vllm`, `sglang`).
pub(crate) fn engine_kind(py: Python<'_>, name: &str) -> PyResult<EngineKind> {
    name.parse()
        .map_err(|e: orbitkv_state::Error| invalid(py, e.to_string()))
}

/// A rank argument: an int, or `"replicated"` (one copy shared by every rank, as MLA's).
fn rank_spec(py: Python<'_>, rank: &Bound<'_, PyAny>) -> PyResult<RankSpec> {
    if let Ok(r) = rank.extract::<u32>() {
        return Ok(RankSpec::Rank(r));
    }
    match rank.extract::<String>() {
        Ok(s) if s == "replicated" => Ok(RankSpec::Replicated),
        _ => Err(invalid(py, "rank: an int, or \"replicated\"")),
    }
}

/// The description of one rank's record bytes of one cache group (docs/format.md).
///
/// `layout` lists the record's axes from outermost to innermost as `(dim, extent,
/// stride_bytes)`, `dim` one of `layer`, `page`, `token`, `kv_head`, `head_dim`, `kv_split`,
/// `state`. The record is the packed bytes these axes describe, whatever the engine's
/// placement in memory (that goes into the pool's geometry).
#[pyclass(frozen, from_py_object, module = "orbitkv._native")]
#[derive(Clone)]
pub struct StateFormat {
    pub(crate) inner: Format,
}

#[pymethods]
impl StateFormat {
    #[new]
    #[pyo3(signature = (
        *, dtype, kv_quant, block_tokens, layers, layout, kv_heads, head_size_k, head_size_v,
        engine, release, attention_backend, rank = None, tensor = 1, pipeline = 1, context = 1
    ))]
    #[expect(
        clippy::too_many_arguments,
        reason = "keyword arguments of a Python constructor"
    )]
    fn new(
        py: Python<'_>,
        dtype: &str,
        kv_quant: &str,
        block_tokens: u32,
        layers: u32,
        layout: Vec<(String, u64, u64)>,
        kv_heads: u32,
        head_size_k: u32,
        head_size_v: u32,
        engine: &str,
        release: &str,
        attention_backend: &str,
        rank: Option<&Bound<'_, PyAny>>,
        tensor: u32,
        pipeline: u32,
        context: u32,
    ) -> PyResult<Self> {
        let axes = layout
            .iter()
            .map(|(dim, extent, stride)| {
                Ok(Axis {
                    dim: Dim::from_name(dim).map_err(|e| invalid(py, e.to_string()))?,
                    extent: *extent,
                    stride: *stride,
                })
            })
            .collect::<PyResult<Vec<_>>>()?;
        let engine = engine_kind(py, engine)?;
        let inner = Format {
            dtype: label(py, "dtype", dtype)?,
            kv_quant: label(py, "kv_quant", kv_quant)?,
            block_tokens,
            layers,
            layout: axes,
            heads: HeadShape {
                kv_heads,
                head_size_k,
                head_size_v,
            },
            parallel: ParallelShape {
                tensor,
                pipeline,
                context,
            },
            rank: match rank {
                None => RankSpec::Rank(0),
                Some(r) => rank_spec(py, r)?,
            },
            compat: ImplTag {
                engine,
                release: label(py, "release", release)?,
                attention_backend: label(py, "attention_backend", attention_backend)?,
            },
        };
        inner.validate().map_err(|e| invalid(py, e.to_string()))?;
        Ok(Self { inner })
    }

    /// Bytes of one record of this format.
    #[getter]
    fn record_bytes(&self) -> Option<u64> {
        self.inner.record_bytes()
    }

    /// The canonical encoding (what Register carries per group).
    fn encode<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let b = self
            .inner
            .encode()
            .map_err(|e| invalid(py, e.to_string()))?;
        Ok(PyBytes::new(py, &b))
    }

    /// SHA-256 of the canonical encoding.
    fn digest<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let d = self
            .inner
            .digest()
            .map_err(|e| invalid(py, e.to_string()))?;
        Ok(PyBytes::new(py, &d.0))
    }

    fn __repr__(&self) -> String {
        format!("{:?}", self.inner)
    }
}

/// One cache group of an instance: its id, what it holds (`dense_kv`, `mla`,
/// `sliding_window_kv`, `ssm_state`, ...), tokens per page, bytes per page per rank, and one
/// format per rank in rank order (or one `"replicated"` format).
#[pyclass(frozen, from_py_object, module = "orbitkv._native")]
#[derive(Clone)]
pub struct CacheGroup {
    pub(crate) inner: CacheGroupSpec,
}

#[pymethods]
impl CacheGroup {
    #[new]
    #[pyo3(signature = (*, id, component, block_tokens, page_bytes, formats))]
    fn new(
        py: Python<'_>,
        id: u32,
        component: &str,
        block_tokens: u32,
        page_bytes: u64,
        formats: Vec<StateFormat>,
    ) -> PyResult<Self> {
        Ok(Self {
            inner: CacheGroupSpec {
                id: CacheGroupId(id),
                component: Component::from_name(component)
                    .map_err(|e| invalid(py, e.to_string()))?,
                block_tokens,
                page_bytes,
                formats: formats.into_iter().map(|f| f.inner).collect(),
            },
        })
    }

    /// The group's id.
    #[getter]
    fn id(&self) -> u32 {
        self.inner.id.0
    }

    /// What the group's records hold.
    #[getter]
    fn component(&self) -> &'static str {
        self.inner.component.name()
    }
}

/// An instance's storage layout: its parallel shape and cache groups, validated and put in
/// canonical order; `encode()` is what Register carries, `digest()` names it.
#[pyclass(frozen, module = "orbitkv._native")]
pub struct StorageLayout {
    inner: Layout,
}

#[pymethods]
impl StorageLayout {
    #[new]
    #[pyo3(signature = (groups, *, tensor = 1, pipeline = 1, context = 1))]
    fn new(
        py: Python<'_>,
        groups: Vec<CacheGroup>,
        tensor: u32,
        pipeline: u32,
        context: u32,
    ) -> PyResult<Self> {
        let parallel = ParallelShape {
            tensor,
            pipeline,
            context,
        };
        let inner = Layout::new(parallel, groups.into_iter().map(|g| g.inner).collect())
            .map_err(|e| invalid(py, e.to_string()))?;
        Ok(Self { inner })
    }

    /// The canonical encoding.
    fn encode<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, self.inner.encode())
    }

    /// SHA-256 of the canonical encoding.
    fn digest<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.inner.digest())
    }

    /// The format of `group` at `rank` (a replicated group's one format at every rank).
    fn format_of(&self, group: u32, rank: u32) -> Option<StateFormat> {
        self.inner
            .format_of(CacheGroupId(group), rank)
            .map(|f| StateFormat { inner: f.clone() })
    }

    /// The group ids, in canonical order.
    #[getter]
    fn groups(&self) -> Vec<u32> {
        self.inner.groups().iter().map(|g| g.id.0).collect()
    }
}

/// A recovery rule as Register carries it: `("prefix", 0)`, `("window", tokens)`,
/// `("checkpoint", grid)`.
pub(crate) fn rule(py: Python<'_>, name: &str, param: u64) -> PyResult<Rule> {
    match name {
        "prefix" => Ok(Rule::Prefix),
        "window" => Ok(Rule::Window { tokens: param }),
        "checkpoint" => Ok(Rule::Checkpoint { grid: param }),
        other => Err(invalid(
            py,
            format!("rule {other:?}: prefix, window or checkpoint"),
        )),
    }
}

/// Where one cache group's bytes lie in a pool: for page `i`, layer `l` and part `p`, a run of
/// `layer_bytes / parts` bytes at `offset + i*page_stride + l*layer_stride + p*part_stride`
/// from the start of the pool's page memory. `layers_inside`: each run holds every layer
/// (SGLang's `page_first`).
#[pyclass(frozen, from_py_object, module = "orbitkv._native", get_all)]
#[derive(Clone, Copy)]
pub struct GroupGeometry {
    /// The cache group.
    pub group: u32,
    /// Layers of the group in a page.
    pub layers: u32,
    /// Offset of page 0's layer 0 (part 0).
    pub offset: u64,
    /// Distance between pages.
    pub page_stride: u64,
    /// Distance between layers.
    pub layer_stride: u64,
    /// Bytes of one layer in a record (all its parts).
    pub layer_bytes: u64,
    /// Parts each layer is split into (K and V placed apart: 2).
    pub parts: u32,
    /// Distance between parts.
    pub part_stride: u64,
    /// The layers lie inside each run.
    pub layers_inside: bool,
}

#[pymethods]
impl GroupGeometry {
    #[new]
    #[pyo3(signature = (*, group, layers, offset, page_stride, layer_stride, layer_bytes,
        parts = 1, part_stride = 0, layers_inside = false))]
    #[expect(
        clippy::too_many_arguments,
        reason = "keyword arguments of a Python constructor"
    )]
    fn new(
        group: u32,
        layers: u32,
        offset: u64,
        page_stride: u64,
        layer_stride: u64,
        layer_bytes: u64,
        parts: u32,
        part_stride: u64,
        layers_inside: bool,
    ) -> Self {
        Self {
            group,
            layers,
            offset,
            page_stride,
            layer_stride,
            layer_bytes,
            parts,
            part_stride,
            layers_inside,
        }
    }

    /// A group whose pages lie one after another, `page_bytes` apart, each layer one run of
    /// `layer_bytes`, `layer_stride` from the next.
    #[staticmethod]
    #[pyo3(signature = (*, group, layers, offset, layer_stride, layer_bytes, page_bytes))]
    fn packed(
        group: u32,
        layers: u32,
        offset: u64,
        layer_stride: u64,
        layer_bytes: u64,
        page_bytes: u64,
    ) -> Self {
        Self::from(Geometry::packed(
            group,
            layers,
            offset,
            layer_stride,
            layer_bytes,
            page_bytes,
        ))
    }

    fn __repr__(&self) -> String {
        format!("{:?}", Geometry::from(*self))
    }
}

impl From<Geometry> for GroupGeometry {
    fn from(g: Geometry) -> Self {
        Self {
            group: g.group,
            layers: g.layers,
            offset: g.offset,
            page_stride: g.page_stride,
            layer_stride: g.layer_stride,
            layer_bytes: g.layer_bytes,
            parts: g.parts,
            part_stride: g.part_stride,
            layers_inside: g.layers_inside,
        }
    }
}

impl From<GroupGeometry> for Geometry {
    fn from(g: GroupGeometry) -> Self {
        Self {
            group: g.group,
            layers: g.layers,
            offset: g.offset,
            page_stride: g.page_stride,
            layer_stride: g.layer_stride,
            layer_bytes: g.layer_bytes,
            parts: g.parts,
            part_stride: g.part_stride,
            layers_inside: g.layers_inside,
        }
    }
}

/// A pool's registration: its id, bytes per page, page count, the groups a page holds and
/// whether they alias the same bytes (vLLM's hybrid allocator). Validated on construction, by
/// the same arithmetic the daemon applies.
#[pyclass(frozen, module = "orbitkv._native")]
#[derive(Clone)]
pub struct PoolSpec {
    pub(crate) inner: Spec,
}

#[pymethods]
impl PoolSpec {
    #[new]
    #[pyo3(signature = (*, pool, page_bytes, pages, groups, aliased = false))]
    fn new(
        py: Python<'_>,
        pool: u32,
        page_bytes: u64,
        pages: u32,
        groups: Vec<GroupGeometry>,
        aliased: bool,
    ) -> PyResult<Self> {
        let inner = Spec {
            pool: PoolId(pool),
            page_bytes,
            pages,
            aliased,
            groups: groups.into_iter().map(Geometry::from).collect(),
        };
        inner.validate().map_err(|e| invalid(py, e.to_string()))?;
        Ok(Self { inner })
    }

    /// The pool's id.
    #[getter]
    fn pool(&self) -> u32 {
        self.inner.pool.0
    }

    /// Bytes per page.
    #[getter]
    fn page_bytes(&self) -> u64 {
        self.inner.page_bytes
    }

    /// Pages in the pool.
    #[getter]
    fn pages(&self) -> u32 {
        self.inner.pages
    }

    /// Whether the groups alias the same bytes.
    #[getter]
    fn aliased(&self) -> bool {
        self.inner.aliased
    }

    /// The groups' geometry.
    #[getter]
    fn groups(&self) -> Vec<GroupGeometry> {
        self.inner.groups.iter().copied().map(Into::into).collect()
    }
}
