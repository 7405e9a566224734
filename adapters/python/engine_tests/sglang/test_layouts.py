"""SGLang's host layouts: each mapped one round-trips through the daemon; records written
through one layout are read through another of the same record order (`layer_first`,
`page_first_direct`, `page_unified`); a layout not mapped is refused at start-up, saying what
to change."""

from __future__ import annotations

from pathlib import Path

import pytest
from daemon import Daemon
from harness import PAGE, Rank, same_bytes
from orbitkv.sglang import StartupRefused


def tokens(k: int) -> list[int]:
    return [(i * 41 + 7 + k * 97) % 1000 for i in range(3 * PAGE)]


LAYOUTS = ["page_first", "page_first_direct", "page_head", "layer_first", "page_unified"]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_each_layout_round_trips(daemon: Daemon, model_dir: Path, layout: str) -> None:
    k = LAYOUTS.index(layout)
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


def test_a_record_written_layer_first_is_read_page_first_direct_and_page_unified(
    daemon: Daemon, model_dir: Path
) -> None:
    w = Rank(model_dir, "lf-w", daemon.socket, layout="layer_first")
    readers = [
        Rank(model_dir, f"{layout}-r", daemon.socket, layout=layout)
        for layout in ("page_first_direct", "page_unified")
    ]
    other = Rank(model_dir, "pf-r", daemon.socket, layout="page_first")
    try:
        keys, data = w.publish(tokens(9))
        for r in readers:
            done, loaded = r.get(keys)
            assert done == [True] * 3 and same_bytes(loaded, data), r.layout
        # page_first holds a page's layers inside each token: another record order.
        assert other.exists(keys) == 0
    finally:
        for x in [w, *readers, other]:
            x.close()


def test_a_layout_not_mapped_is_refused(daemon: Daemon, model_dir: Path) -> None:
    """`page_unified` with two head groups interleaves K and V by group. (`page_first_kv_split`
    is refused by SGLang's MHA host pool itself.)"""
    with pytest.raises(StartupRefused, match="--hicache-mem-layout"):
        Rank(model_dir, "unified", daemon.socket, layout="page_unified", head_groups=2)


def test_page_first_kv_split_is_refused(
    daemon: Daemon, model_dir: Path, mla_model_dir: Path
) -> None:
    """A host pool in `page_first_kv_split` keeps a page's parts in separate buffers: refused in
    one line. (On this machine SGLang's own pools cannot be built in it, MHA's refusing the
    layout and MLA's wanting an indexer: the pools are built as `page_first` and then report
    it.)"""
    for model, mla in ((model_dir, False), (mla_model_dir, True)):
        r = Rank(model, f"kv-split-{mla}", daemon.socket, mla=mla)
        try:
            r.host.layout = "page_first_kv_split"
            with pytest.raises(StartupRefused, match="page_first_kv_split is not mapped"):
                r.backend.register_mem_pool_host(r.host)
        finally:
            r.close()
