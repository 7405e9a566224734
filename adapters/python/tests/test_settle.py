"""Pages settled after a Load or Publish whose reply will not come: each gets a new generation
once the daemon holds no lease on it; one still leased at the deadline is revoked (a new
generation all the same, so the daemon discards a copy out of it that is still running).

The daemon's side is played through the pool's shared state words, as docs/protocol.md lays
them out: word `i` at byte 64 + 8i, the generation in its high 48 bits, leases in its low 16."""

from __future__ import annotations

import logging
import struct
import threading
import time

import orbitkv
import pytest
from orbitkv.session import settle


def lease(m: orbitkv.mapped.Mapping, page: int, by: int) -> None:
    """Adds `by` to page `page`'s lease count, as the daemon does (one thread here)."""
    at = 64 + 8 * page
    (word,) = struct.unpack_from("<Q", m.region, at)
    struct.pack_into("<Q", m.region, at, word + by)


def test_a_page_whose_lease_ends_in_time_gets_a_new_generation(
    caplog: pytest.LogCaptureFixture,
) -> None:
    m = orbitkv.mapped.allocate(4, 4096)
    pool = m.pool
    lease(m, 2, 1)
    before = pool.generation(2)
    ends = threading.Timer(0.1, lease, (m, 2, -1))
    ends.start()
    with caplog.at_level(logging.ERROR, logger="orbitkv"):
        settle(pool, [2], timeout=10.0)
    ends.join()
    assert pool.generation(2) == before + 1
    assert pool.leases(2) == 0
    assert "revoked" not in caplog.text


def test_a_page_leased_past_the_deadline_is_revoked(caplog: pytest.LogCaptureFixture) -> None:
    m = orbitkv.mapped.allocate(4, 4096)
    pool = m.pool
    lease(m, 1, 1)
    free, leased = pool.generation(0), pool.generation(1)
    start = time.monotonic()
    with caplog.at_level(logging.ERROR, logger="orbitkv"):
        settle(pool, [0, 1], timeout=0.2)
    assert time.monotonic() - start >= 0.2
    assert pool.generation(0) == free + 1
    # Revoked: a new generation while the lease is still counted, so the daemon's copy out of
    # the page, when it ends, finds its generation stale.
    assert pool.generation(1) == leased + 1
    assert pool.leases(1) == 1
    assert "revoked" in caplog.text and "[1]" in caplog.text
    # The daemon gives its lease back; the page is reused as any other.
    lease(m, 1, -1)
    assert pool.reuse(1) == leased + 2
