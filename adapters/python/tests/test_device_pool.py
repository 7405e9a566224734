"""A device pool from Python: an IPC handle that is not 64 bytes, or a device UUID that is not
16, is refused before anything is sent; a daemon without the CUDA backend refuses the pool as
unsupported, saying why (the vLLM connector then stages its pages instead). A pool's
registration ends on request, answered once the daemon has let go of its memory."""

from __future__ import annotations

import orbitkv
import pytest
from conftest import Daemon
from engine import Engine

PAGES = 4


def test_a_device_pool_without_the_cuda_backend_is_unsupported(daemon: Daemon) -> None:
    engine = Engine("py-device", no_scheduler=True)
    _, sealed = engine.seal(daemon.socket)
    conn, token = engine.worker_conn(0), sealed[0].token
    states = orbitkv.HostPool(engine.spec(pool=1, pages=PAGES), states_only=True)
    with pytest.raises(orbitkv.InvalidInput, match="64 bytes"):
        conn.register_device_pool(token, states, 0, b"\x00" * 66, 0)
    with pytest.raises(orbitkv.InvalidInput, match="16 bytes"):
        conn.register_device_pool(token, states, 0, b"\x00" * 64, 0, b"\x01" * 15)
    with pytest.raises(orbitkv.RefusedError) as refused:
        conn.register_device_pool(token, states, 0, b"\x00" * 64, 0)
    assert refused.value.code == "unsupported"
    assert "cuda" in refused.value.detail.lower()
    # The session goes on: the same pages staged through a host pool.
    assert conn.register_pool(token, orbitkv.HostPool(engine.spec(pool=1, pages=PAGES))) == 1
    # Ended on request; a second end names an unknown pool.
    conn.unregister_pool(token, 1)
    with pytest.raises(orbitkv.RefusedError, match="pool 1"):
        conn.unregister_pool(token, 1)
    engine.close()
