"""Host pools mapped into this process, found again by address.

An engine that places its KV memory inside a host pool (``allocate`` or ``map_pool``, then
tensors over ``Mapping.pages``) lets an adapter register that memory in place: the daemon
copies straight into and out of the engine's pages, with no staging copy. ``find`` tells an
adapter whether an address range lies inside such a mapping, and where."""

from __future__ import annotations

import ctypes
import mmap
import os
import threading
from dataclasses import dataclass

from orbitkv._native import GroupGeometry, HostPool, PoolSpec

_lock = threading.Lock()
_mappings: list[Mapping] = []
# Buffers exported from each mapping: they keep it from being closed under the tensors over it.
_anchors: list[ctypes.c_char] = []


@dataclass(frozen=True)
class Mapping:
    """A host pool's whole region (state words, then pages) mapped read-write into this process."""

    pool: HostPool
    region: mmap.mmap
    # The address of the region's first byte in this process.
    address: int

    @property
    def pages(self) -> memoryview:
        """The pool's page memory (page 0 first), for tensors over it."""
        return memoryview(self.region)[self.pool.data_offset :]

    @property
    def size(self) -> int:
        return len(self.region)


def map_pool(pool: HostPool) -> Mapping:
    """Maps `pool`'s region into this process and remembers it for `find`. The mapping lives
    as long as the process: an engine's KV memory does."""
    spec = pool.spec
    size = pool.data_offset + spec.page_bytes * spec.pages
    if os.fstat(pool.fd).st_size < size:
        raise ValueError("the pool holds state words only: it has no page memory to map")
    region = mmap.mmap(pool.fd, size)
    anchor = ctypes.c_char.from_buffer(region)
    mapping = Mapping(pool, region, ctypes.addressof(anchor))
    with _lock:
        _mappings.append(mapping)
        _anchors.append(anchor)
    return mapping


def allocate(pages: int, page_bytes: int) -> Mapping:
    """Shared memory for an engine to place its KV caches in: a host pool of `pages` pages of
    `page_bytes` bytes, mapped. An adapter that finds the engine's pages inside it registers
    them in place."""
    spec = PoolSpec(
        pool=1,
        page_bytes=page_bytes,
        pages=pages,
        groups=[
            GroupGeometry.packed(
                group=0,
                layers=1,
                offset=0,
                layer_stride=page_bytes,
                layer_bytes=page_bytes,
                page_bytes=page_bytes,
            )
        ],
    )
    return map_pool(HostPool(spec))


def find(address: int, length: int) -> tuple[Mapping, int] | None:
    """The mapping holding `length` bytes from `address`, and the range's offset in the pool's
    region (its descriptor's offset); `None` when no mapped pool holds all of it."""
    with _lock:
        for m in _mappings:
            if m.address <= address and address + length <= m.address + m.size:
                return m, address - m.address
    return None
