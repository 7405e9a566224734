"""SGLang's host layouts: each mapped one round-trips through the daemon; records written
through one layout are read through another of the same record order (`layer_first` and
`page_first_direct`); a layout not mapped is refused at start-up, saying what to change."""

from __future__ import annotations

from pathlib import Path

import pytest
from daemon import Daemon
from harness import PAGE, Rank, same_bytes
from orbitkv.sglang import StartupRefused


def tokens(k: int) -> list[int]:
    return [(i * 41 + 7 + k * 97) % 1000 for i in range(3 * PAGE)]


@pytest.mark.parametrize("layout", ["page_first", "page_first_direct", "page_head", "layer_first"])
def test_each_layout_round_trips(daemon: Daemon, model_dir: Path, layout: str) -> None:
    k = ["page_first", "page_first_direct", "page_head", "layer_first"].index(layout)
    w = Rank(model_dir, f"{layout}-w", daemon.socket, layout=layout)
    r = Rank(model_dir, f"{layout}-r", daemon.socket, layout=layout, ratio=3.0)
    try:
        keys, data = w.publish(tokens(k))
        assert r.exists(keys) == 3
        done, loaded = r.get(keys)
        assert done == [True] * 3 and same_bytes(loaded, data)
    finally:
        w.close()
        r.close()


def test_a_record_written_layer_first_is_read_page_first_direct(
    daemon: Daemon, model_dir: Path
) -> None:
    w = Rank(model_dir, "lf-w", daemon.socket, layout="layer_first")
    r = Rank(model_dir, "pfd-r", daemon.socket, layout="page_first_direct")
    other = Rank(model_dir, "pf-r", daemon.socket, layout="page_first")
    try:
        keys, data = w.publish(tokens(9))
        done, loaded = r.get(keys)
        assert done == [True] * 3 and same_bytes(loaded, data)
        # page_first holds a page's layers inside each token: another record order.
        assert other.exists(keys) == 0
    finally:
        w.close()
        r.close()
        other.close()


def test_a_layout_not_mapped_is_refused(daemon: Daemon, model_dir: Path) -> None:
    """`page_unified` interleaves a layer's K and V by head group. (`page_first_kv_split` is
    refused by SGLang's MHA host pool itself.)"""
    with pytest.raises(StartupRefused, match="--hicache-mem-layout"):
        Rank(model_dir, "unified", daemon.socket, layout="page_unified")
