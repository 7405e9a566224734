"""Host pools mapped into this process are found again by address: what an adapter checks
before registering an engine's memory in place."""

from __future__ import annotations

import ctypes

import orbitkv
import pytest


def address(view: memoryview) -> int:
    return ctypes.addressof(ctypes.c_char.from_buffer(view))


def test_a_mapped_pool_is_found_by_the_address_of_its_pages() -> None:
    m = orbitkv.mapped.allocate(4, 4096)
    pool, pages = m.pool, m.pages
    assert len(pages) == 4 * 4096
    start = address(pages)
    found = orbitkv.mapped.find(start + 4096, 2 * 4096)
    assert found is not None
    assert found[0] is m and found[1] == pool.data_offset + 4096
    # Bytes written through the mapping are the pool's page bytes.
    pages[4096:4100] = b"abcd"
    assert pool.read(1, 0, 4) == b"abcd"


def test_a_range_not_wholly_inside_a_mapped_pool_is_not_found() -> None:
    m = orbitkv.mapped.allocate(4, 4096)
    end = m.address + m.size
    assert orbitkv.mapped.find(end - 4096, 4097) is None
    assert orbitkv.mapped.find(end, 1) is None
    other = bytearray(8192)
    assert orbitkv.mapped.find(address(memoryview(other)), 8192) is None


def test_a_states_only_pool_has_no_pages_to_map() -> None:
    with pytest.raises(ValueError, match="state words only"):
        orbitkv.mapped.map_pool(
            orbitkv.HostPool(orbitkv.mapped.allocate(4, 4096).pool.spec, states_only=True)
        )
