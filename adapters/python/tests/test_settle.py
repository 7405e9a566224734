"""Pages settled after a Load or Publish whose reply will not come: each gets a new generation
once the daemon holds no lease on it; one still leased at the deadline is revoked (a new
generation all the same, so the daemon discards a copy out of it that is still running). A copy
into a page cannot be discarded: after a Load, a page still leased is waited for while the
daemon's process is stopped, and revoked once it runs on or is gone.

The daemon's side is played through the pool's shared state words, as docs/protocol.md lays
them out: word `i` at byte 64 + 8i, the generation in its high 48 bits, leases in its low 16."""

from __future__ import annotations

import logging
import struct
import threading
import time
from pathlib import Path

import orbitkv
import pytest
from daemon import Daemon
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


def test_after_a_load_a_page_is_waited_for_while_the_daemon_is_stopped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    d = Daemon(tmp_path)
    try:
        conn = orbitkv.Connection(d.socket)
        assert conn.daemon_pid == d.proc.pid
        assert conn.daemon_state() == "running"
        m = orbitkv.mapped.allocate(4, 4096)
        pool = m.pool
        # A running daemon that holds a page past the deadline is not in a copy: revoked.
        lease(m, 2, 1)
        before = pool.generation(2)
        settle(pool, [2], 0.1, conn)
        assert pool.generation(2) == before + 1
        # The daemon is stopped in the middle of a copy into page 3.
        lease(m, 3, 1)
        d.pause()
        assert conn.daemon_state() == "stopped"
        before = pool.generation(3)
        waiting = threading.Thread(target=settle, args=(pool, [3], 0.1, conn))
        with caplog.at_level(logging.ERROR, logger="orbitkv"):
            waiting.start()
            waiting.join(timeout=1.0)
            # Past the deadline, and not revoked: the copy may still land.
            assert waiting.is_alive(), "a page a stopped daemon copies into was given up"
            assert pool.generation(3) == before
            assert "waiting, so that no late copy lands" in caplog.text
            # The daemon is gone: nothing of it can land any more.
            d.proc.kill()
            d.proc.wait()
            waiting.join(timeout=5.0)
        assert not waiting.is_alive()
        assert conn.daemon_state() == "gone"
        assert pool.generation(3) == before + 1
        assert "a copy into them may still land" not in caplog.text
    finally:
        d.stop()
