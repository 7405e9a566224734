"""Nothing the daemon does reaches SGLang's threads as an exception: a daemon killed mid-run
turns every call into a miss or a page not stored, and a restarted daemon is registered with
again and serves the records it kept. A daemon that stops answering costs one call its wait,
not every call; a lease it grants after the Acquire's wait is given back at once; a durable
reply awaited on a lost connection is never taken from the next one. Weights changed in place
(the scheduler's real `update_weights_from_disk`, wrapped as the backend wraps it, even without
a weight version; or a new weight version in SGLang's runtime context) stop serving and storing
until a restart."""

from __future__ import annotations

import contextlib
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import orbitkv
import pytest
from daemon import Daemon
from harness import PAGE, Rank, same_bytes
from orbitkv import weights
from orbitkv.sglang import storage
from orbitkv.sglang.settings import GROUP, POOL
from sglang.srt.managers.scheduler_components.weight_updater import SchedulerWeightUpdaterManager
from sglang.srt.mem_cache.hicache_storage import HiCacheStorageExtraInfo
from sglang.srt.model_executor.model_runner_components.weight_updater import WeightUpdater
from sglang.srt.runtime_context import get_context

TOKENS = [(i * 61 + 5) % 1000 for i in range(3 * PAGE)]


@pytest.fixture
def own_daemon(tmp_path: Path) -> Iterator[Daemon]:
    d = Daemon(tmp_path)
    yield d
    d.stop()


def test_a_killed_daemon_is_a_miss_and_a_restarted_one_serves_again(
    own_daemon: Daemon, model_dir: Path
) -> None:
    w = Rank(model_dir, "kept-w", own_daemon.socket)
    r = Rank(model_dir, "kept-r", own_daemon.socket)
    try:
        keys, data = w.publish(TOKENS)
        assert r.exists(keys) == 3
        own_daemon.proc.kill()
        own_daemon.proc.wait()
        # No exception out of any call.
        assert r.exists(keys) == 0
        assert r.get(keys)[0] == [False] * 3
        idx = w.alloc(3)
        assert w.backend.batch_set_v1(keys, idx, None) == [False] * 3
        w.host.free(idx)
        assert r.backend.counters()["errors"] >= 1
        restarted = Daemon(own_daemon.root)
        own_daemon.proc = restarted.proc
        deadline = time.monotonic() + 15.0
        while r.exists(keys) != 3:
            assert time.monotonic() < deadline, "registered again, the kept records served"
            time.sleep(0.2)
        done, loaded = r.get(keys)
        assert done == [True] * 3 and same_bytes(loaded, data)
    finally:
        w.close()
        r.close()


def test_weights_changed_in_place_stop_serving_and_storing(daemon: Daemon, model_dir: Path) -> None:
    w = Rank(model_dir, "rl-w", daemon.socket)
    keys, _ = w.publish([t + 7 for t in TOKENS])
    r = Rank(model_dir, "rl-r", daemon.socket)
    try:
        assert r.exists(keys) == 3
        # What SGLang records when `update_weights_from_*` names a new weight version.
        get_context().override("tokenizer.weight_version", weight_version="rl-step-2")
        assert r.exists(keys) == 0
        assert r.get(keys)[0] == [False] * 3
        new = r.keys([t + 8 for t in TOKENS])
        idx = r.alloc(3)
        assert r.backend.batch_set_v1(new, idx, None) == [False] * 3
        r.host.free(idx)
        assert r.backend.weights_changed and r.backend.counters().get("published_pages", 0) == 0
    finally:
        get_context().override(
            "tokenizer.weight_version", weight_version=r.backend.s.weight_version
        )
        w.close()
        r.close()


@pytest.fixture
def restore() -> Iterator[None]:
    yield
    weights.reset()


def test_a_weight_update_without_a_version_stops_serving(
    daemon: Daemon, model_dir: Path, restore: None
) -> None:
    w = Rank(model_dir, "disk-w", daemon.socket)
    keys, _ = w.publish([t + 9 for t in TOKENS])
    r = Rank(model_dir, "disk-r", daemon.socket)
    try:
        assert r.exists(keys) == 3
        loads: list[str] = []

        def load(path: str, load_format: object, **kw: object) -> tuple[bool, str]:
            loads.append(path)
            return True, ""

        runner = SimpleNamespace(weight_updater=SimpleNamespace(update_weights_from_disk=load))
        manager = SimpleNamespace(
            _observe_weight_load=lambda source: contextlib.nullcontext(),
            _select_runners=lambda: [("target", runner)],
            record_weight_version_after_update=lambda version: None,
            flush_cache_after_weight_update=lambda req, ok, message: (ok, message),
        )
        request = SimpleNamespace(
            model_path="new-weights",
            load_format=None,
            recapture_cuda_graph=False,
            weight_version=None,
        )
        SchedulerWeightUpdaterManager.update_weights_from_disk(manager, request)  # type: ignore[arg-type]
        assert loads == ["new-weights"], "the real method ran"
        assert r.exists(keys) == 0
        idx = r.alloc(3)
        assert r.backend.batch_set_v1(r.keys(TOKENS), idx, None) == [False] * 3
        r.host.free(idx)
    finally:
        w.close()
        r.close()


def test_a_weight_load_in_the_model_runner_stops_serving(
    daemon: Daemon, model_dir: Path, restore: None
) -> None:
    """The model runner's own weight load, however the scheduler reached it (its request
    dispatcher holds the scheduler's methods as bound before the backend was attached)."""
    w = Rank(model_dir, "runner-w", daemon.socket)
    keys, _ = w.publish([t + 13 for t in TOKENS])
    r = Rank(model_dir, "runner-r", daemon.socket)
    try:
        assert r.exists(keys) == 3
        # The real method, on a stand-in runner: it fails once it reaches the model, after the
        # wrap has seen it.
        with pytest.raises(AttributeError):
            WeightUpdater.update_weights_from_disk(SimpleNamespace(), "new-weights", None)  # type: ignore[arg-type]
        assert r.exists(keys) == 0
    finally:
        w.close()
        r.close()


def test_a_publish_whose_reply_never_comes_lets_go_of_its_pages(
    daemon: Daemon, model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no PublishCopied the call returns false, but only once the daemon holds none of
    the pages and each has a new generation: SGLang reuses them at once, and a late copy of
    the daemon's is refused by the fence."""
    r = Rank(model_dir, "no-reply", daemon.socket)
    backend, states = r.backend, r.backend.states[POOL]
    monkeypatch.setattr(backend, "_ask", lambda conn, request, timeout: None)
    try:
        keys = r.keys([t + 11 for t in TOKENS])
        idx = r.alloc(3)
        pages = [int(idx[i * PAGE]) // PAGE for i in range(3)]
        before = [states.generation(p) for p in pages]
        assert (
            backend.batch_set_v1(keys, idx, HiCacheStorageExtraInfo(prefix_keys=[])) == [False] * 3
        )
        # Published at before + 1; moved on past it.
        assert all(states.generation(p) == g + 2 for p, g in zip(pages, before, strict=True))
        assert all(states.leases(p) == 0 for p in pages)
        r.host.free(idx)
    finally:
        r.close()


def test_a_daemon_that_stops_answering_costs_one_call_its_wait(
    own_daemon: Daemon, model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The daemon holds its connection open and answers nothing (SIGSTOP): the first call
    waits for its reply, the calls after it return at once for `UNANSWERED_PAUSE`, and once
    the daemon answers again after the pause, hits come back."""
    monkeypatch.setattr(storage, "UNANSWERED_PAUSE", 1.0)
    w = Rank(model_dir, "silent-w", own_daemon.socket)
    r = Rank(model_dir, "silent-r", own_daemon.socket)
    try:
        keys, data = w.publish([t + 17 for t in TOKENS])
        assert r.exists(keys) == 3
        own_daemon.pause()
        try:
            t0 = time.monotonic()
            assert r.exists(keys) == 0
            assert storage.QUERY_WAIT <= time.monotonic() - t0 < 5.0
            assert r.backend.counters()["timeouts"] == 1
            # Neither a Query, an Acquire nor a Publish waits while the daemon is silent.
            t0 = time.monotonic()
            assert r.exists(keys) == 0
            assert time.monotonic() - t0 < 0.2
            t0 = time.monotonic()
            assert r.get(keys)[0] == [False] * 3
            assert time.monotonic() - t0 < 0.2
            idx = r.alloc(3)
            t0 = time.monotonic()
            new = r.keys([t + 18 for t in TOKENS])
            extra = HiCacheStorageExtraInfo(prefix_keys=[])
            assert r.backend.batch_set_v1(new, idx, extra) == [False] * 3
            assert time.monotonic() - t0 < 0.2
            r.host.free(idx)
            assert r.backend.counters()["timeouts"] == 1
        finally:
            own_daemon.resume()
        time.sleep(1.1)
        assert r.exists(keys) == 3, "answered again once the daemon is back"
        done, loaded = r.get(keys)
        assert done == [True] * 3 and same_bytes(loaded, data)
    finally:
        w.close()
        r.close()


def test_a_lease_granted_after_its_wait_is_given_back(
    own_daemon: Daemon, model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The daemon stalls past the Acquire's wait, then grants the lease after all: the next
    call releases it, rather than leaving the records pinned until the lease's TTL."""
    monkeypatch.setattr(storage, "QUERY_WAIT", 0.3)
    monkeypatch.setattr(storage, "UNANSWERED_PAUSE", 0.5)
    w = Rank(model_dir, "late-w", own_daemon.socket)
    r = Rank(model_dir, "late-r", own_daemon.socket)

    def leases() -> int:
        session = r.backend.session
        assert session is not None and session.conn is not None
        found = re.search(r"^orbitkv_leases (\d+)$", session.conn.stats(), re.M)
        assert found is not None
        return int(found.group(1))

    try:
        keys, _ = w.publish([t + 19 for t in TOKENS])
        assert r.exists(keys) == 3
        own_daemon.pause()
        threading.Timer(1.0, own_daemon.resume).start()
        assert r.get(keys)[0] == [False] * 3
        assert len(r.backend.late) == 1
        time.sleep(1.5)
        assert leases() == 1, "granted after the wait"
        deadline = time.monotonic() + 5.0
        while leases() and time.monotonic() < deadline:
            r.exists(keys)
            time.sleep(0.05)
        assert leases() == 0, "the late lease was given back, not left to its TTL"
        assert not r.backend.late
        assert r.backend.counters()["late_leases_released"] == 1
    finally:
        w.close()
        r.close()


def test_a_durable_reply_is_taken_on_its_own_connection(
    daemon: Daemon, model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Request ids restart on a new connection: a publish of a lost connection whose
    PublishDurable was not taken is forgotten, not matched with the next connection's request
    of the same id. Publishes awaited are bounded: past the bound the oldest is forgotten."""
    w = Rank(model_dir, "durable-w", daemon.socket)
    b = w.backend
    try:
        with monkeypatch.context() as m:
            # The PublishDurable replies are left untaken.
            m.setattr(b, "wait_durable", lambda timeout: True)
            m.setattr(storage, "DURABLE_WAIT_MAX", 2)
            for k in range(3):
                idx = w.alloc(3)
                keys = w.keys([t + 30 + k for t in TOKENS])
                extra = HiCacheStorageExtraInfo(prefix_keys=[])
                assert b.batch_set_v1(keys, idx, extra) == [True] * 3
                w.host.free(idx)
        assert len(b.durable_wait) == 2 and b.counters()["durable_unknown"] == 1
        old, request = b.durable_wait[-1]
        assert b.session is not None
        b.session.lost("dropped by the test", old)
        deadline = time.monotonic() + 10.0
        while not w.sealed(wait=1.0):
            assert time.monotonic() < deadline, "registered again"
            time.sleep(0.1)
        conn, seal = b.session.conn, b.session.seal
        assert conn is not None and conn is not old and seal is not None
        # Another thread's Query gets the awaited publish's id on the new connection.
        query = (seal.token, seal.epoch, 0, PAGE, [(GROUP, [bytes.fromhex(keys[0])])])
        q = conn.submit_query(*query)
        while q < request:
            conn.forget(q)
            q = conn.submit_query(*query)
        assert q == request
        assert b.wait_durable(1.0) and not b.durable_wait
        assert isinstance(conn.wait(q, timeout=5.0), orbitkv.Proof), "the Query's own reply"
        assert b.counters()["durable_unknown"] == 3
    finally:
        w.close()
