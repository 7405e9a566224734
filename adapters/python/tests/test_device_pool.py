"""A device pool from Python: an IPC handle that is not 64 bytes is refused before anything is
sent; a daemon without the CUDA backend refuses the pool as unsupported, saying why (the vLLM
connector then stages its pages instead)."""

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
    with pytest.raises(orbitkv.RefusedError) as refused:
        conn.register_device_pool(token, states, 0, b"\x00" * 64, 0)
    assert refused.value.code == "unsupported"
    assert "cuda" in refused.value.detail.lower()
    # The session goes on: the same pages staged through a host pool.
    assert conn.register_pool(token, orbitkv.HostPool(engine.spec(pool=1, pages=PAGES))) == 1
    engine.close()
