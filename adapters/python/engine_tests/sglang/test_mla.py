"""MLA (a DeepSeek-V2 configuration): one copy of each page serves every tensor-parallel rank.
Only the storage writer (rank 0) stores it; every rank of another server loads the same bytes,
in each host layout SGLang maps for MLA."""

from __future__ import annotations

from pathlib import Path

import pytest
from daemon import Daemon
from harness import PAGE, same_bytes, tensor_parallel

TOKENS = [(i * 71 + 3) % 1000 for i in range(3 * PAGE)]
LAYOUTS = ["page_first", "page_first_direct", "layer_first", "page_unified"]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_writer_stores_and_every_rank_loads(
    daemon: Daemon, mla_model_dir: Path, layout: str
) -> None:
    k = LAYOUTS.index(layout)
    tokens = [t + k for t in TOKENS]
    writers = tensor_parallel(
        mla_model_dir, f"mla-w-{k}", daemon.socket, 2, mla=True, layout=layout
    )
    readers = tensor_parallel(
        mla_model_dir, f"mla-r-{k}", daemon.socket, 2, mla=True, layout=layout
    )
    try:
        assert [w.backend.s.writer for w in writers] == [True, False]
        keys, data = writers[0].publish(tokens)
        # The other rank stores nothing (SGLang does not ask it to; asked, it declines).
        idx = writers[1].alloc(3)
        assert writers[1].backend.batch_set_v1(keys, idx, None) == [False] * 3
        writers[1].host.free(idx)
        for r in readers:
            assert r.exists(keys) == 3
            done, loaded = r.get(keys)
            assert done == [True] * 3 and same_bytes(loaded, data), f"rank {r.tp_rank}"
    finally:
        for x in writers + readers:
            x.close()
