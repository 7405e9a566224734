"""Preemption: vLLM frees a preempted request's blocks at once and hands them to others. The
connector makes sure the copies of what those blocks held are out first, so every record it
published holds the bytes of its own block (a consumer loads them and compares)."""

from __future__ import annotations

from pathlib import Path

from daemon import Daemon
from harness import BLOCK, Instance


def prompt(k: int) -> list[int]:
    return [(i * 67 + 21 + k * 401) % 1000 for i in range(5 * BLOCK)] + [6]


def test_records_of_preempted_requests_hold_their_own_bytes(
    daemon: Daemon, model_dir: Path
) -> None:
    # 12 blocks for two requests that grow to 8 blocks each: one is preempted.
    p = Instance(model_dir, "cramped", daemon.socket, blocks=13)
    reader = Instance(model_dir, "roomy", daemon.socket)
    try:
        rs = [p.request(f"g{k}", prompt(k), max_tokens=3 * BLOCK) for k in range(2)]
        p.run()
        assert any(r.num_preemptions for r in rs), "a request was preempted"
        assert p.worker.worker.wait_durable(10.0)
        for k, r in enumerate(rs):
            # Every full block the request ever had: its prompt and its decoded tokens.
            tokens = [*r.prompt_token_ids, *r.output_token_ids]
            start, loaded, expected = reader.loaded(f"read{k}", tokens)
            assert start >= 5 * BLOCK, f"g{k}: its prompt's records were published"
            assert loaded == expected, f"g{k}: each record holds its own block's bytes"
    finally:
        p.close()
        reader.close()
