"""A Publish out of vLLM's own memory waits for the step that wrote its blocks: on a GPU the
daemon copies on a stream of its own, so the worker holds the Publish until the step's CUDA
event has completed (with async scheduling the step may still run when `wait_for_save` is
called). Here the fence is a gate the test opens; on a GPU it is `torch.cuda.Event`. A step's
publishes past the daemon's per-request limits go as several Publishes."""

from __future__ import annotations

import re
from pathlib import Path

import orbitkv.session
import pytest
from daemon import Daemon
from harness import BLOCK, Instance
from orbitkv.vllm.metadata import OrbitKVMetadata

PROMPT = [(i * 59 + 13) % 1000 for i in range(4 * BLOCK)] + [3]


class Gate:
    """A step still running until `open` (or until something waits for it)."""

    def __init__(self) -> None:
        self.done = False
        self.waited = 0

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        self.waited += 1
        self.done = True


def test_a_publish_waits_for_its_step(daemon: Daemon, model_dir: Path) -> None:
    p = Instance(model_dir, "fenced", daemon.socket)
    c = Instance(model_dir, "after-fence", daemon.socket)
    w = p.worker.worker
    assert w.memory is not None
    gates: list[Gate] = []

    def fence() -> Gate:
        gates.append(Gate())
        return gates[-1]

    w.memory.fence = fence  # type: ignore[method-assign]
    try:
        p.request("w", PROMPT)
        for _ in range(5):
            p.step()
        assert gates, "the step's publishes took a fence"
        assert w.pending and not w.in_flight, "held while the step runs"
        assert w.stats["published_bytes"] == 0
        assert "w" not in p.freed, "its blocks stay allocated"
        assert c.start_of("early", PROMPT) == 0, "nothing published yet"
        for g in gates:
            g.done = True
        p.run()
        assert not w.pending and "w" in p.freed
        assert all(g.waited == 0 for g in gates), "sent once done, never waited for"
        assert w.wait_durable(10.0)
        start, loaded, expected = c.loaded("late", PROMPT)
        assert start == 4 * BLOCK and loaded == expected
    finally:
        c.close()
        p.close()


def test_a_preemption_waits_for_the_step(daemon: Daemon, model_dir: Path) -> None:
    """Blocks handed to another request must be copied out first: the worker waits for the
    step, then for the copies."""
    p = Instance(model_dir, "fenced-preempt", daemon.socket)
    w = p.worker.worker
    assert w.memory is not None
    gate = Gate()
    w.memory.fence = lambda: gate  # type: ignore[method-assign]
    try:
        p.request("w", [t + 1 for t in PROMPT])
        for _ in range(3):
            p.step()
        assert w.pending
        held = set().union(*(x.requests for x in w.pending))
        p.worker.handle_preemptions(OrbitKVMetadata(preempted=held))
        assert gate.waited == 1 and not w.pending and not w.in_flight
        p.run()
    finally:
        p.close()


def test_a_steps_publishes_go_in_publishes_the_daemon_takes(
    daemon: Daemon, model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One page a Publish: a step's four blocks go as four, each stored."""
    monkeypatch.setattr(orbitkv.session, "PUBLISH_CHUNK_PAGES", 1)
    p = Instance(model_dir, "chunked-w", daemon.socket)
    c = Instance(model_dir, "chunked-r", daemon.socket)

    def committed() -> int:
        conn = c.worker.worker.session.conn
        assert conn is not None
        found = re.search(r"^orbitkv_committed_publishes_total (\d+)$", conn.stats(), re.M)
        assert found is not None
        return int(found.group(1))

    fresh = [(i * 31 + 7) % 1000 for i in range(4 * BLOCK)] + [5]
    try:
        before = committed()
        assert p.start_of("w", fresh) == 0
        worker = p.worker.worker
        assert worker.wait_durable(10.0)
        assert worker.stats["durable_pages"] == 4
        assert committed() - before == 4, "four Publishes"
        assert c.start_of("r", fresh) == 4 * BLOCK, "every one stored"
    finally:
        c.close()
        p.close()
