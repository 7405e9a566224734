"""Tensor and pipeline parallelism, a worker-side connector per rank of one instance: each rank
publishes and loads its own shard (its heads, or its stage's layers); a prefix one rank never
published, or one published by an instance of another parallel shape, gives 0 external
tokens."""

from __future__ import annotations

from pathlib import Path

from daemon import Daemon
from harness import BLOCK, Instance


def prompt(k: int) -> list[int]:
    return [(i * 59 + 13 + k * 307) % 1000 for i in range(4 * BLOCK)] + [4]


def test_a_rank_that_never_published_gives_no_external_tokens(
    daemon: Daemon, model_dir: Path
) -> None:
    half = Instance(model_dir, "tp-half", daemon.socket, tp=2, stepping=(0,))
    whole = Instance(model_dir, "tp-whole", daemon.socket, tp=2)
    single = Instance(model_dir, "tp-one", daemon.socket)
    reader = Instance(model_dir, "tp-reader", daemon.socket, tp=2)
    try:
        assert half.start_of("w", prompt(0)) == 0
        assert whole.start_of("w", prompt(1)) == 0
        assert single.start_of("w", prompt(2)) == 0
        for inst in (half, whole, single):
            assert all(w.worker.wait_durable(10.0) for w in inst.workers)
        assert reader.start_of("missing-rank", prompt(0)) == 0
        assert reader.start_of("another-parallel-shape", prompt(2)) == 0
        assert reader.start_of("both-ranks", prompt(1)) == 4 * BLOCK
        # Each rank loaded its own shard.
        for w in reader.workers:
            assert w.worker.stats["loaded_bytes"] == 4 * w.worker.layer_bytes * 2
    finally:
        for inst in (half, whole, single, reader):
            inst.close()


def test_pipeline_stages_publish_and_load_their_own_layers(daemon: Daemon, model_dir: Path) -> None:
    writer = Instance(model_dir, "pp-writer", daemon.socket, pp=2)
    reader = Instance(model_dir, "pp-reader", daemon.socket, pp=2)
    try:
        assert writer.start_of("w", prompt(3)) == 0
        assert all(w.worker.wait_durable(10.0) for w in writer.workers)
        assert reader.start_of("r", prompt(3)) == 4 * BLOCK
        for w in reader.workers:
            assert len(w.worker.memory.layers) == 1, "one layer per stage"
            assert w.worker.stats["loaded_bytes"] == 4 * w.worker.layer_bytes
    finally:
        writer.close()
        reader.close()
