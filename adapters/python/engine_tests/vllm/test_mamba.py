"""A hybrid model with Mamba layers (`mamba_cache_mode="align"`), groups from vLLM's own planner:
a Mamba state is published from the exact block vLLM offers for a block boundary, and restored
only at a boundary whose state is stored, into the block vLLM allocates for it; the boundary is
the one vLLM's own hybrid coordinator accepts for the same records."""

from __future__ import annotations

from pathlib import Path

import pytest
from daemon import Daemon
from harness import BLOCK, Instance
from judge import hit_by_vllm, proves_as_vllm, published

# Two blocks a step: Mamba states at the end of each step's chunk.
CHUNKED: dict[str, object] = {"max_num_batched_tokens": 2 * BLOCK}
# Every block boundary's state retained (vLLM's default keeps the last prompt boundary only).
DENSE: dict[str, object] = {**CHUNKED, "prefix_cache_retention_interval": None}


def prompt(k: int, blocks: int = 6) -> list[int]:
    return [(i * 37 + 5 + k * 101) % 1000 for i in range(blocks * BLOCK)] + [7]


def test_groups_come_from_vllms_planner(daemon: Daemon, mamba_model_dir: Path) -> None:
    inst = Instance(mamba_model_dir, "mb-plan", daemon.socket, args=CHUNKED)
    try:
        kinds = sorted(g.kind for g in inst.worker.worker.groups)
        assert kinds == ["full", "mamba"]
        (mamba,) = [g for g in inst.worker.worker.groups if g.kind == "mamba"]
        assert mamba.rule == ("checkpoint", BLOCK)
        assert inst.worker.worker.memory.kind == "in place"
    finally:
        inst.close()


@pytest.mark.parametrize("memory", ["pool", "allocate"])
def test_a_mamba_prefix_round_trips_byte_for_byte(
    daemon: Daemon, mamba_model_dir: Path, memory: str
) -> None:
    p = Instance(mamba_model_dir, f"mb-w-{memory}", daemon.socket, args=DENSE, memory=memory)
    c = Instance(mamba_model_dir, f"mb-r-{memory}", daemon.socket, args=CHUNKED, memory=memory)
    k = 0 if memory == "pool" else 20
    try:
        assert p.start_of("w", prompt(k)) == 0
        assert p.worker.worker.wait_durable(10.0)
        start, r = c.first_step("r", prompt(k))
        assert start == 6 * BLOCK
        groups = c.scheduler.kv_cache_manager.get_block_ids("r")
        hashes = [bytes(h) for h in r.block_hashes[:6]]
        for g, blocks in enumerate(groups):
            if c._mamba(g):
                # The state at the boundary, in the block vLLM allocated at its place.
                assert blocks[:5] == [0] * 5
                assert c.page(blocks[5], g) == c.expected(hashes[5], g)
            else:
                assert [c.page(b, g) for b in blocks[:6]] == [c.expected(h, g) for h in hashes]
        c.run()
    finally:
        c.close()
        p.close()


@pytest.mark.parametrize(
    ("args", "drop", "expect"),
    [
        (DENSE, set(), 6),
        # The state at 96 missing: the one at 64 is the longest restorable.
        (DENSE, {(0, 5)}, 4),
        # Only the last prompt boundary's state kept (vLLM's default): 96.
        (CHUNKED, set(), 6),
        # ... and without it, nothing.
        (CHUNKED, {(0, 5)}, 0),
    ],
)
def test_the_boundary_is_the_one_vllms_coordinator_accepts(
    daemon: Daemon,
    mamba_model_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    args: dict[str, object],
    drop: set[tuple[int, int]],
    expect: int,
) -> None:
    name = f"mb-judge-{len(args)}-{len(drop)}"
    k = 1 + len(args) * 2 + len(drop)
    records = published(monkeypatch, drop)
    p = Instance(mamba_model_dir, f"{name}-w", daemon.socket, args=args)
    c = Instance(mamba_model_dir, f"{name}-r", daemon.socket, args=CHUNKED)
    try:
        proves_as_vllm(p, c, prompt(k), records, expect)
    finally:
        c.close()
        p.close()


def test_full_attention_a_window_and_mamba_together(
    daemon: Daemon, mamba_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One attention layer over a 32-token window: three kinds of groups, each its own rule."""
    records = published(monkeypatch, set())
    p = Instance(mamba_model_dir, "mbw-w", daemon.socket, args=DENSE, window=32)
    c = Instance(mamba_model_dir, "mbw-r", daemon.socket, args=CHUNKED, window=32)
    try:
        kinds = sorted({g.kind for g in c.worker.worker.groups})
        assert kinds == ["full", "mamba", "window"]
        assert p.start_of("w", prompt(30)) == 0
        assert p.worker.worker.wait_durable(10.0)
        assert hit_by_vllm(c, records, prompt(30)) == 6 * BLOCK
        start, r = c.first_step("r", prompt(30))
        assert start == 6 * BLOCK
        hashes = [bytes(h) for h in r.block_hashes[:6]]
        for g, blocks in enumerate(c.scheduler.kv_cache_manager.get_block_ids("r")):
            kind = c.worker.worker.shapes[g].kind
            held = {"mamba": [5], "window": [4, 5], "full": list(range(6))}[kind]
            assert [i for i in range(6) if blocks[i]] == held, kind
            assert [c.page(blocks[i], g) for i in held] == [c.expected(hashes[i], g) for i in held]
        c.run()
    finally:
        c.close()
        p.close()
