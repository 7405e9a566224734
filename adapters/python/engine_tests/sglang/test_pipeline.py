"""Pipeline parallelism: each stage holds its part of the model's layers (as SGLang partitions
them) and is a rank of its own, its records of its own format. A prefix is served only when
every stage stored its part; each stage loads its own, byte-exact."""

from __future__ import annotations

from pathlib import Path

import pytest
from daemon import Daemon
from harness import PAGE, model_variant, pipeline, same_bytes

TOKENS = [(i * 41 + 7) % 1000 for i in range(3 * PAGE)]
# Three layers over two stages: SGLang gives the last stage the extra one.
LAYERS = 3


@pytest.fixture(scope="module")
def model3(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return model_variant(model_dir, tmp_path_factory.mktemp("tiny-3"), num_hidden_layers=LAYERS)


def test_every_stage_stores_and_loads_its_layers(daemon: Daemon, model3: Path) -> None:
    writers = pipeline(model3, "pp-w", daemon.socket, 2, LAYERS)
    assert [w.host.layer_num for w in writers] == [1, 2]
    readers = pipeline(model3, "pp-r", daemon.socket, 2, LAYERS)
    try:
        keys, first = writers[0].publish(TOKENS, b"stage0")
        # Stage 1's layers are not stored yet: no stage may restore the prefix.
        assert [r.exists(keys) for r in readers] == [0, 0]
        _, second = writers[1].publish(TOKENS, b"stage1")
        assert [r.exists(keys) for r in readers] == [3, 3]
        for r, data in zip(readers, (first, second), strict=True):
            done, loaded = r.get(keys)
            assert done == [True] * 3 and same_bytes(loaded, data), r.pp_rank
    finally:
        for x in writers + readers:
            x.close()
