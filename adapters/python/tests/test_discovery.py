"""Finding the daemon: the configured socket, else ORBITKV_SOCKET, else
./orbitkv-data/orbitkv.sock where it exists, else the packaged service's socket; the error
lists every path tried."""

from __future__ import annotations

import os
import socket
import threading
import time
from pathlib import Path

import orbitkv
import pytest
from conftest import Daemon

SYSTEM = "/run/orbitkv/orbitkv.sock"


def test_the_order_of_candidates(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("ORBITKV_SOCKET", raising=False)
    assert orbitkv.socket_candidates() == [SYSTEM]
    (tmp_path / "orbitkv-data").mkdir()
    (tmp_path / "orbitkv-data" / "orbitkv.sock").touch()
    assert orbitkv.socket_candidates() == ["./orbitkv-data/orbitkv.sock", SYSTEM]
    monkeypatch.setenv("ORBITKV_SOCKET", "/elsewhere/env.sock")
    assert orbitkv.socket_candidates() == ["/elsewhere/env.sock"]
    assert orbitkv.socket_candidates("/configured.sock") == ["/configured.sock"]


def test_each_source_reaches_the_daemon(
    daemon: Daemon, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("ORBITKV_SOCKET", raising=False)
    with orbitkv.Connection(daemon.socket) as c:
        assert c.socket == daemon.socket
    monkeypatch.setenv("ORBITKV_SOCKET", daemon.socket)
    with orbitkv.Connection() as c:
        assert c.socket == daemon.socket and c.server
    monkeypatch.delenv("ORBITKV_SOCKET")
    (tmp_path / "orbitkv-data").mkdir()
    os.symlink(daemon.socket, tmp_path / "orbitkv-data" / "orbitkv.sock")
    with orbitkv.Connection() as c:
        assert c.socket == "./orbitkv-data/orbitkv.sock"


def test_no_daemon_lists_every_path_tried(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("ORBITKV_SOCKET", raising=False)
    (tmp_path / "orbitkv-data").mkdir()
    (tmp_path / "orbitkv-data" / "orbitkv.sock").touch()
    with pytest.raises(orbitkv.DaemonNotFound) as e:
        orbitkv.Connection()
    assert e.value.tried == ["./orbitkv-data/orbitkv.sock", SYSTEM]
    assert "./orbitkv-data/orbitkv.sock" in str(e.value) and SYSTEM in str(e.value)
    assert "ORBITKV_SOCKET" in str(e.value)
    assert isinstance(e.value, orbitkv.OrbitKVError) and e.value.code == "daemon_not_found"


def test_a_listener_that_never_answers_ends_the_handshake(tmp_path: Path) -> None:
    path = str(tmp_path / "silent.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as silent:
        silent.bind(path)
        silent.listen(1)
        start = time.monotonic()
        with pytest.raises(orbitkv.ConnectionLost):
            orbitkv.Connection(path, handshake_timeout=0.3)
        assert time.monotonic() - start < 5


def test_instance_names(daemon: Daemon) -> None:
    assert orbitkv.naming.vllm_instance("engine-7_dp1") == "engine-7_dp1"
    assert orbitkv.naming.sglang_instance(None, 30000, 1) == "sglang-30000-dp1"
    assert orbitkv.naming.sglang_instance({"instance": "a"}, 30000, 0) == "a"
    # Each data-parallel rank is an instance of its own.
    assert orbitkv.naming.sglang_instance({"instance": "a"}, 30000, 2) == "a-dp2"
    for bad in ["", "x" * (orbitkv.MAX_NAME + 1)]:
        with pytest.raises(orbitkv.InvalidInput):
            orbitkv.naming.vllm_instance(bad)
    with pytest.raises(orbitkv.InvalidInput):
        orbitkv.naming.sglang_instance({"instance": 7}, 30000, 0)
    # The client refuses a name the daemon could not take, before sending it.
    with orbitkv.Connection(daemon.socket) as c, pytest.raises(orbitkv.InvalidInput):
        c.submit_register(
            instance="x" * (orbitkv.MAX_NAME + 1), role="scheduler", rank=0, workers=1,
            identity=bytes(32), layout=b"", domain="vllm/sha256_cbor", rules=[],
        )  # fmt: skip


def test_bytes_that_are_no_message_are_a_protocol_violation(daemon: Daemon, tmp_path: Path) -> None:
    """A peer between the client and the daemon passes the handshake through, then answers
    the next request with bytes that are not a frame."""
    path = str(tmp_path / "relay.sock")
    done = threading.Event()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as relay:
        relay.bind(path)
        relay.listen(1)

        def serve() -> None:
            client, _ = relay.accept()
            with client, socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as upstream:
                upstream.connect(daemon.socket)
                upstream.sendall(client.recv(4096))  # Hello
                client.sendall(upstream.recv(4096))  # Welcome
                client.recv(4096)  # the next request
                client.sendall(b"not a frame, " * 4)
                done.wait(10)

        t = threading.Thread(target=serve)
        t.start()
        try:
            conn = orbitkv.Connection(path)
            request = conn.submit_query(b"\x01" * 32, 1, 0, 4, [(0, [b"\x02" * 32])])
            with pytest.raises(orbitkv.ProtocolViolation) as e:
                conn.wait(request, timeout=10)
            assert e.value.code == "protocol_violation"
            conn.close()
        finally:
            done.set()
            t.join(timeout=10)
