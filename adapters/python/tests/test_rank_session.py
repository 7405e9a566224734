"""A rank's session (`orbitkv.session.Session`), as the engine adapters hold one, against a daemon
that is away or refuses the rank: it never blocks, and why it cannot register is logged once per
reason, not at every retry and not never. A listener that never answers the handshake holds
an attempt after the first only briefly."""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import time
from pathlib import Path

import orbitkv
import orbitkv.session
import pytest
from conftest import Daemon
from engine import Engine
from orbitkv.session import Registration, Session


def registration(tmp_path: Path) -> Registration:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "llama", "num_hidden_layers": 2}')
    (model / "model.safetensors").write_bytes(os.urandom(1 << 12))
    identity = orbitkv.resolve_identity(
        str(model),
        engine="vllm",
        release="0.33.0",
        dtype="bfloat16",
        kv_cache_dtype="auto",
        quantization="none",
        attention_backend="FLASH_ATTN",
        cache_variant="paged",
    )
    engine = Engine("alone")
    return Registration(
        instance="alone",
        role="scheduler",
        rank=0,
        workers=1,
        identity=identity,
        layout=engine.layout(),
        domain="vllm/sha256",
        model="llama",
        revision=None,
    )


def test_an_unreachable_daemon_is_logged_once_with_its_reason(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    socket = str(tmp_path / "nowhere" / "orbitkv.sock")
    session = Session(socket, registration(tmp_path))
    caplog.set_level(logging.WARNING, logger="orbitkv")
    for _ in range(4):
        t0 = time.monotonic()
        assert session.sealed() is None
        assert time.monotonic() - t0 < 1.0, "the engine is never held up"
        # Past the back-off: each call tries again.
        session._retry_at = 0.0
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert "cannot register with the daemon" in warnings[0]
    assert "nowhere" in warnings[0], "the path tried is named"
    assert session.conn is None and session.seal is None


def test_a_refused_registration_is_logged_once_with_its_reason(
    tmp_path: Path, daemon: Daemon, caplog: pytest.LogCaptureFixture
) -> None:
    # The scheduler registers as rank 0: the daemon refuses rank 1, and says so.
    refused = dataclasses.replace(registration(tmp_path), rank=1)
    session = Session(daemon.socket, refused)
    caplog.set_level(logging.WARNING, logger="orbitkv")
    for _ in range(3):
        assert session.sealed(wait=2.0) is None
        session._retry_at = 0.0
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert "rank 0" in warnings[0], warnings[0]


def test_a_retry_waits_briefly_for_a_daemon_that_never_answers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A listener that accepts and never answers the handshake (a restarting daemon) holds
    the first attempt up to the handshake's wait, and each later attempt only briefly: an
    adapter may hold a lock while it reconnects."""
    monkeypatch.setattr(orbitkv.session, "HANDSHAKE_WAIT", 2.0)
    monkeypatch.setattr(orbitkv.session, "RECONNECT_HANDSHAKE", 0.3)
    path = str(tmp_path / "silent.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as silent:
        silent.bind(path)
        silent.listen(8)
        session = Session(path, registration(tmp_path))
        t0 = time.monotonic()
        assert session.sealed() is None
        assert 2.0 <= time.monotonic() - t0 < 5.0
        for _ in range(2):
            session._retry_at = 0.0
            t0 = time.monotonic()
            assert session.sealed() is None
            assert time.monotonic() - t0 < 1.5
