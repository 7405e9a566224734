"""OrbitKV as one member of vLLM's `MultiConnector`, after `NixlConnector` (prefill/decode
disaggregation, Nixl as producer or consumer): the OrbitKV member answers exactly as it does
alone, and loads the same bytes. Nixl's scheduler side is vLLM's real one; its worker side needs
NIXL's transport, so the workers are OrbitKV's, given OrbitKV's part of each step."""

from __future__ import annotations

from pathlib import Path

import pytest
from daemon import Daemon
from harness import BLOCK, Instance


def prompt(k: int) -> list[int]:
    return [(i * 43 + 11 + k * 137) % 1000 for i in range(5 * BLOCK)] + [9]


@pytest.mark.parametrize("nixl_role", ["kv_producer", "kv_consumer"])
def test_the_orbitkv_member_answers_as_it_does_alone(
    daemon: Daemon, model_dir: Path, nixl_role: str
) -> None:
    nixl: dict[str, object] = {"kv_connector": "NixlConnector", "kv_role": nixl_role}
    writer = Instance(model_dir, f"multi-w-{nixl_role}", daemon.socket)
    alone = Instance(model_dir, f"multi-alone-{nixl_role}", daemon.socket)
    composed = Instance(model_dir, f"multi-{nixl_role}", daemon.socket, beside=nixl)
    k = 0 if nixl_role == "kv_producer" else 1
    try:
        assert type(composed.connector).__name__ == "MultiConnector"
        assert type(composed.connector._connectors[0]).__name__.startswith("Nixl")  # type: ignore[attr-defined]
        assert writer.start_of("w", prompt(k)) == 0
        assert writer.worker.worker.wait_durable(10.0)
        assert alone.start_of("a", prompt(k)) == 5 * BLOCK
        start, loaded, expected = composed.loaded("c", prompt(k))
        assert start == 5 * BLOCK and loaded == expected
        # A prefix nobody published: 0 from both (each publishes it as it computes it).
        assert composed.start_of("c2", prompt(k + 2)) == 0
        assert alone.start_of("a2", prompt(k + 4)) == 0
    finally:
        for inst in (composed, alone, writer):
            inst.close()
