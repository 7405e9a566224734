"""vLLM's own hybrid coordinator as the judge of a boundary: what it accepts when its cache
holds exactly the records a producer published, against what the daemon proves to a consumer."""

from __future__ import annotations

from typing import Any

import pytest
from harness import BLOCK, Instance
from orbitkv.vllm import worker
from vllm.v1.core.kv_cache_utils import KVCacheBlock


def hit_by_vllm(inst: Instance, records: set[tuple[int, bytes]], tokens: list[int]) -> int:
    """The tokens vLLM's hybrid coordinator accepts for `tokens` when its cache holds exactly
    `records` (group, block hash)."""
    coordinator = inst.scheduler.kv_cache_manager.coordinator
    request = inst.new_request("judge", tokens)

    def cached(block_hash: bytes, groups: list[int]) -> list[KVCacheBlock] | None:
        if all((g, bytes(block_hash)) in records for g in groups):
            return [KVCacheBlock(block_id=1) for _ in groups]
        return None

    real = coordinator.block_pool.get_cached_block
    coordinator.block_pool.get_cached_block = cached
    try:
        _, hit, _ = coordinator.find_longest_cache_hit(request.block_hashes, request.num_tokens - 1)
    finally:
        coordinator.block_pool.get_cached_block = real
    return int(hit)


def published(
    monkeypatch: pytest.MonkeyPatch, drop: set[tuple[int, int]]
) -> set[tuple[int, bytes]]:
    """The (group, hash) of every page the workers publish from now on, leaving out the pages
    whose (group, block index) is in `drop` (a record the daemon never got)."""
    records: set[tuple[int, bytes]] = set()
    real = worker.WorkerSide._submit

    def submit(self: worker.WorkerSide, pages: list[Any], requests: set[str]) -> None:
        kept = [p for p in pages if (p[0], p[4] // BLOCK) not in drop]
        records.update((p[0], p[2]) for p in kept)
        if kept:
            real(self, kept, requests)

    monkeypatch.setattr(worker.WorkerSide, "_submit", submit)
    return records


def proves_as_vllm(
    p: Instance, c: Instance, tokens: list[int], records: set[tuple[int, bytes]], blocks: int
) -> None:
    """`p` computes and publishes `tokens`; vLLM's coordinator, given the records published,
    and the daemon, asked by `c`, both accept `blocks` blocks."""
    assert p.start_of("w", tokens) == 0
    assert p.worker.worker.wait_durable(10.0)
    assert hit_by_vllm(c, records, tokens) == blocks * BLOCK
    assert c.start_of("r", tokens) == blocks * BLOCK
