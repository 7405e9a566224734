"""Tensor parallel 2 as two backends of one instance: every rank answers `batch_exists` with
what the daemon proves for all ranks, so SGLang's all-reduce stays consistent; a rank that never
stored its shard leaves both at 0."""

from __future__ import annotations

from pathlib import Path

from daemon import Daemon
from harness import PAGE, Rank, same_bytes, tensor_parallel

TOKENS = [(i * 53 + 29) % 1000 for i in range(3 * PAGE)]


def ranks(model: Path, name: str, socket: str) -> list[Rank]:
    return tensor_parallel(model, name, socket, 2)


def test_both_ranks_store_and_load_their_shards(daemon: Daemon, model_dir: Path) -> None:
    writers = ranks(model_dir, "tp-w", daemon.socket)
    stored = [w.publish(TOKENS, bytes([i])) for i, w in enumerate(writers)]
    readers = ranks(model_dir, "tp-r", daemon.socket)
    try:
        for i, r in enumerate(readers):
            keys, data = stored[i]
            assert r.exists(keys) == 3
            done, loaded = r.get(keys)
            assert done == [True] * 3 and same_bytes(loaded, data), f"rank {i}'s own shard"
    finally:
        for x in writers + readers:
            x.close()


def test_a_rank_that_never_stored_leaves_both_at_zero(daemon: Daemon, model_dir: Path) -> None:
    writers = ranks(model_dir, "half-w", daemon.socket)
    tokens = [t + 3 for t in TOKENS]
    keys, _ = writers[0].publish(tokens)
    readers = ranks(model_dir, "half-r", daemon.socket)
    try:
        assert [r.exists(keys) for r in readers] == [0, 0], "rank 1's shard is missing"
    finally:
        for x in writers + readers:
            x.close()
