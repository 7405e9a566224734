"""Nothing the daemon does reaches SGLang's threads as an exception: a daemon killed mid-run
turns every call into a miss or a page not stored, and a restarted daemon is registered with
again and serves the records it kept. Weights changed in place (a new weight version in SGLang's
runtime context) stop serving and storing until a restart."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from daemon import Daemon
from harness import PAGE, Rank, same_bytes
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
        assert r.backend.get_stats()["errors"] >= 1
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
        assert r.backend.weights_changed and r.backend.get_stats().get("published_pages", 0) == 0
    finally:
        get_context().override(
            "tokenizer.weight_version", weight_version=r.backend.s.weight_version
        )
        w.close()
        r.close()
