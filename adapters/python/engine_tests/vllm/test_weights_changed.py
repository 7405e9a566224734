"""Weights changed in place (the worker's real `reload_weights`, wrapped as the connector wraps
it): from then on the instance gets 0 external tokens and publishes nothing; a load the
scheduler planned before it knew is refused by the worker, and vLLM recomputes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
from daemon import Daemon
from harness import BLOCK, Instance
from orbitkv.vllm import weights
from vllm.v1.worker.gpu_worker import Worker


def prompt(k: int) -> list[int]:
    return [(i * 43 + 9 + k * 211) % 1000 for i in range(4 * BLOCK)] + [3]


@pytest.fixture
def restore() -> Iterator[None]:
    yield
    weights.reset()


def test_a_weight_reload_stops_serving_and_publishing(
    daemon: Daemon, model_dir: Path, restore: None
) -> None:
    p = Instance(model_dir, "trainer-ref", daemon.socket)
    for k in range(3):
        p.request(f"w{k}", prompt(k))
    p.run()
    assert p.worker.worker.wait_durable(10.0)
    p.close()
    c = Instance(model_dir, "rlhf", daemon.socket)
    try:
        assert c.start_of("before", prompt(0)) == 4 * BLOCK
        calls: list[int] = []
        runner = SimpleNamespace(reload_weights=lambda *a, **k: calls.append(1))
        Worker.reload_weights(SimpleNamespace(vllm_config=c.config, model_runner=runner))
        assert calls == [1], "the real method ran"
        stats = c.worker.worker.stats
        published, failures = stats["published_bytes"], stats["load_failures"]
        # The scheduler may not know yet: the worker refuses what it planned.
        first = c.start_of("first", prompt(1))
        assert first == 0 or stats["load_failures"] - failures == 4
        # Now it knows: 0 external tokens.
        assert c.start_of("second", prompt(2)) == 0
        assert c.connector.scheduler.stale
        assert stats["published_bytes"] == published, "nothing published after the change"
    finally:
        c.close()
