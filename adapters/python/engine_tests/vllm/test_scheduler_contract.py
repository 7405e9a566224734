"""The scheduler contract with vLLM's real `Scheduler`: a consumer's external tokens are exactly
the daemon's proven boundary minus its local hits; the pages loaded are byte for byte the pages
another instance published; a finished request's blocks are freed only once its publishes are
copied out; every lease is given back."""

from __future__ import annotations

from pathlib import Path

import pytest
from daemon import Daemon
from harness import BLOCK, Instance

PROMPT = [(i * 37 + 11) % 1000 for i in range(8 * BLOCK)]


def durable(inst: Instance) -> None:
    """Waits until every publish of `inst` is durable: the daemon proves records only then."""
    assert inst.worker.worker.wait_durable(10.0), "publishes not durable within 10 s"


def test_external_tokens_are_the_boundary_minus_local_hits(daemon: Daemon, model_dir: Path) -> None:
    c = Instance(model_dir, "consumer", daemon.socket)
    p = Instance(model_dir, "producer", daemon.socket)
    try:
        # The consumer computes the first 3 blocks itself (nothing is published yet) and keeps
        # them in its prefix cache; it publishes them too.
        assert c.start_of("local", [*PROMPT[: 3 * BLOCK], 999]) == 0
        assert "local" in c.freed, "a publishing request's blocks are freed once copied out"
        durable(c)
        # The producer finds those 3, computes the other 5 and publishes them.
        assert p.start_of("full", [*PROMPT, 998]) == 3 * BLOCK
        durable(p)
        # The consumer holds 3 blocks locally; the daemon proves all 8: 5 external.
        before = c.connector.scheduler.stats["hit_tokens"]
        assert c.start_of("again", [*PROMPT, 997]) == 8 * BLOCK
        assert c.connector.scheduler.stats["hit_tokens"] - before == 5 * BLOCK
        assert c.connector.scheduler.leases == set(), "every lease given back"
    finally:
        c.close()
        p.close()


MEMORIES = [
    # (producer's memory, its layout, consumer's memory, its layout)
    ("pool", "BLNHC", "pool", "LBNHC"),
    ("allocate", "LBNHC", "allocate", "BLNHC"),
    ("pool", "LBNHC", "allocate", "LBNHC"),
    ("allocate", "BLNHC", "pool", "BLNHC"),
]
KIND = {"pool": "in place", "allocate": "staged"}


@pytest.mark.parametrize(("pm", "pl", "cm", "cl"), MEMORIES)
def test_loaded_pages_are_the_published_bytes(
    daemon: Daemon, model_dir: Path, pm: str, pl: str, cm: str, cl: str
) -> None:
    """Byte-identical pages across placements (vLLM's default layer-outermost one and the
    block-outermost one) and memories: vLLM's views over a host pool the package mapped
    (registered in place: the daemon copies straight into and out of them) and vLLM's own CPU
    allocation (staged)."""
    k = MEMORIES.index((pm, pl, cm, cl))
    prompt = [(i * 53 + 7 + k) % 1000 for i in range(4 * BLOCK)] + [5]
    p = Instance(model_dir, f"writer-{k}", daemon.socket, layout=pl, memory=pm)
    c = Instance(model_dir, f"reader-{k}", daemon.socket, layout=cl, memory=cm)
    assert p.worker.worker.memory.kind == KIND[pm]
    assert c.worker.worker.memory.kind == KIND[cm]
    try:
        p.request("w", prompt)
        p.run()
        durable(p)
        start, loaded, expected = c.loaded("probe", prompt)
        assert start == 4 * BLOCK, "all four blocks loaded"
        assert loaded == expected, "the bytes published"
        # vLLM's stats path carries what moved.
        page = len(expected[0])
        assert sum(r.get("loaded_bytes", 0) for r in c.reported) == 4 * page
        assert sum(r.get("published_bytes", 0) for r in p.reported) >= 4 * page
        assert c.connector.scheduler.stats["hit_tokens"] == 4 * BLOCK
    finally:
        c.close()
        p.close()
