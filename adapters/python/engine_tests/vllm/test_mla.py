"""An MLA model under tensor parallelism: every TP rank holds the same latent rows, so one copy
serves them all. Only rank 0 publishes it, and every rank loads it."""

from __future__ import annotations

from pathlib import Path

import torch
from daemon import Daemon
from harness import BLOCK, Instance


def prompt(k: int) -> list[int]:
    return [(i * 61 + 7 + k * 89) % 1000 for i in range(4 * BLOCK)] + [5]


def pages(inst: Instance, rank: int, blocks: list[int]) -> list[bytes]:
    """Rank `rank`'s bytes of `blocks`, every layer, in memory order."""
    out = []
    for b in blocks:
        page = b""
        for n in inst.layer_names:
            x = inst._views[rank][n][b]
            order = sorted(range(x.dim()), key=lambda d: -x.stride(d))
            page += x.permute(order).contiguous().view(torch.uint8).numpy().tobytes()
        out.append(page)
    return out


def test_only_rank_0_publishes_and_every_rank_loads(daemon: Daemon, mla_model_dir: Path) -> None:
    writer = Instance(mla_model_dir, "mla-w", daemon.socket, tp=2)
    reader = Instance(mla_model_dir, "mla-r", daemon.socket, tp=2)
    try:
        (group,) = writer.worker.worker.groups
        assert (group.kind, group.kv_heads, group.head_size) == ("mla", 1, 64 + 16)
        assert writer.start_of("w", prompt(0)) == 0
        assert all(w.worker.wait_durable(10.0) for w in writer.workers)
        published = [w.worker.stats["published_bytes"] for w in writer.workers]
        assert published == [4 * group.layer_bytes * 2, 0], "one copy, rank 0's"
        start, r = reader.first_step("r", prompt(0))
        assert start == 4 * BLOCK
        blocks = reader.scheduler.kv_cache_manager.get_block_ids("r")[0][:4]
        expected = [reader.expected(bytes(h)) for h in r.block_hashes[:4]]
        assert pages(reader, 0, blocks) == expected
        assert pages(reader, 1, blocks) == expected, "rank 1 loaded the same bytes"
        reader.run()
        for w in reader.workers:
            assert w.worker.stats["loaded_bytes"] == 4 * group.layer_bytes * 2
    finally:
        reader.close()
        writer.close()
