//! Host page pools: shared memory the engine writes pages into and the daemon copies from and
//! into, each page fenced by a state word (generation and leases) in the same region.

use std::borrow::Cow;
use std::os::fd::AsRawFd;

use pyo3::prelude::*;
use pyo3::types::PyBytes;

use orbitkv_gpu_bridge::HostPool as Pool;

use crate::errors::{InvalidInput, error};
use crate::layout::PoolSpec;

pub(crate) fn pool_error(py: Python<'_>, e: &orbitkv_gpu_bridge::Error) -> PyErr {
    error::<InvalidInput>(py, "pool", false, 0.0, e.to_string())
}

/// A host page pool in a sealed memfd, created by the engine's side (every page at generation
/// 0), or, with `states_only=True`, only the state words of a pool whose pages are memory the
/// engine allocated itself (registered with `Connection.register_engine_memory_pool`).
///
/// Before writing new contents into a page, call `reuse(index)`: its generation goes up, so
/// every older reference to it is stale (refused while the daemon holds a lease on it).
#[pyclass(frozen, module = "orbitkv._native")]
pub struct HostPool {
    pub(crate) inner: Pool,
}

#[pymethods]
impl HostPool {
    #[new]
    #[pyo3(signature = (spec, *, states_only = false))]
    fn new(py: Python<'_>, spec: &PoolSpec, states_only: bool) -> PyResult<Self> {
        let spec = spec.inner.clone();
        let inner = if states_only {
            Pool::create_states(spec)
        } else {
            Pool::create(spec)
        }
        .map_err(|e| pool_error(py, &e))?;
        Ok(Self { inner })
    }

    /// The pool's registration.
    #[getter]
    fn spec(&self) -> PoolSpec {
        PoolSpec {
            inner: self.inner.spec().clone(),
        }
    }

    /// The region's descriptor (valid while the pool lives).
    #[getter]
    fn fd(&self) -> i32 {
        self.inner.fd().as_raw_fd()
    }

    /// Offset of page 0 in the region.
    #[getter]
    fn data_offset(&self) -> u64 {
        self.inner.data_offset()
    }

    /// Page `index`'s current generation.
    fn generation(&self, py: Python<'_>, index: u32) -> PyResult<u64> {
        Ok(self
            .inner
            .page_ref(index)
            .map_err(|e| pool_error(py, &e))?
            .generation)
    }

    /// Reallocates page `index` before new contents are written: returns its new generation.
    /// Refused while the daemon holds a lease on the page.
    fn reuse(&self, py: Python<'_>, index: u32) -> PyResult<u64> {
        Ok(self
            .inner
            .reuse(index)
            .map_err(|e| pool_error(py, &e))?
            .generation)
    }

    /// Reallocates page `index` even while the daemon holds a lease on it: returns its new
    /// generation. For an engine that has waited past its timeout for the lease to end. A copy
    /// out of the page still running is then discarded by the daemon; a copy into it still
    /// running may land.
    fn revoke(&self, py: Python<'_>, index: u32) -> PyResult<u64> {
        Ok(self
            .inner
            .reuse_ignoring_leases(index)
            .map_err(|e| pool_error(py, &e))?
            .generation)
    }

    /// Leases the daemon holds on page `index` now.
    fn leases(&self, py: Python<'_>, index: u32) -> PyResult<u32> {
        self.inner.leases(index).map_err(|e| pool_error(py, &e))
    }

    /// Writes a record's bytes of `group` (packed, layer 0 first) into page `index`, where the
    /// group's placement puts them.
    fn write_group(
        &self,
        py: Python<'_>,
        index: u32,
        group: u32,
        data: Cow<'_, [u8]>,
    ) -> PyResult<()> {
        self.inner
            .write_group(index, group, &data)
            .map_err(|e| pool_error(py, &e))
    }

    /// Page `index`'s bytes of `group`, packed as a record holds them.
    fn read_group<'py>(
        &self,
        py: Python<'py>,
        index: u32,
        group: u32,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let g = self
            .inner
            .spec()
            .group(group)
            .map_err(|e| pool_error(py, &e))?;
        let len = usize::try_from(g.bytes_for(&g.all_layers()))
            .map_err(|_| crate::errors::invalid(py, "group too large"))?;
        let mut out = vec![0u8; len];
        self.inner
            .read_group(index, group, &mut out)
            .map_err(|e| pool_error(py, &e))?;
        Ok(PyBytes::new(py, &out))
    }

    /// Writes `data` at `offset` into the page memory's `index`-th window of one page size.
    fn write(&self, py: Python<'_>, index: u32, offset: u64, data: Cow<'_, [u8]>) -> PyResult<()> {
        self.inner
            .write(index, offset, &data)
            .map_err(|e| pool_error(py, &e))
    }

    /// `length` bytes at `offset` of the page memory's `index`-th window of one page size.
    fn read<'py>(
        &self,
        py: Python<'py>,
        index: u32,
        offset: u64,
        length: usize,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let mut out = vec![0u8; length];
        self.inner
            .read(index, offset, &mut out)
            .map_err(|e| pool_error(py, &e))?;
        Ok(PyBytes::new(py, &out))
    }
}
