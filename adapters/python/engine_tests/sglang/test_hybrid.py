"""A hybrid model's pools through SGLang's v2 storage calls, over SGLang's real host pools: the
KV pages (v1 calls), a sliding-window pool and a Mamba pool (v2 calls), as SGLang's hybrid
cache controller moves them. A hit is a boundary where the KV prefix, the window's pages and
the Mamba checkpoint all hold."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from daemon import Daemon
from harness import PAGE, Rank, model_variant, same_bytes
from sglang.srt.mem_cache.hicache_storage import (
    HiCacheStorageExtraInfo,
    PoolHitPolicy,
    PoolName,
    PoolTransfer,
)

# The model's attention window: SGLang keeps its last ceil(40 / 16) = 3 pages.
WINDOW = 40
WINDOW_PAGES = 3
TOKENS = list(range(300, 300 + 6 * PAGE))


@pytest.fixture(scope="module")
def hybrid_model_dir(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return model_variant(model_dir, tmp_path_factory.mktemp("tiny-hybrid"), sliding_window=WINDOW)


@pytest.fixture
def ranks(
    daemon: Daemon, hybrid_model_dir: Path, request: pytest.FixtureRequest
) -> Iterator[tuple[Rank, Rank]]:
    """A writer and a reader of the same computation, with host pools of different sizes."""
    name = request.node.name.removeprefix("test_")[:40]
    writer = Rank(hybrid_model_dir, f"{name}-w", daemon.socket, hybrid=True)
    reader = Rank(hybrid_model_dir, f"{name}-r", daemon.socket, hybrid=True, ratio=3.0)
    assert writer.sealed(5.0) and reader.sealed(5.0)
    yield writer, reader
    writer.close()
    reader.close()


def info(prefix: list[str]) -> HiCacheStorageExtraInfo:
    return HiCacheStorageExtraInfo(prefix_keys=prefix)


def swa(idx: torch.Tensor | None, keys: list[str]) -> PoolTransfer:
    return PoolTransfer(
        name=PoolName.SWA, host_indices=idx, keys=keys, hit_policy=PoolHitPolicy.TRAILING_PAGES
    )


def mamba(slot: torch.Tensor | None, key: str) -> PoolTransfer:
    return PoolTransfer(
        name=PoolName.MAMBA, host_indices=slot, keys=[key], hit_policy=PoolHitPolicy.TRAILING_PAGES
    )


def fill(r: Rank, kv: torch.Tensor, window: torch.Tensor, slot: torch.Tensor) -> None:
    """Random bytes in the KV slots `kv`, the window slots `window` and the Mamba `slot`."""
    for buffer, index in (
        (r.host.kv_buffer, kv),
        (r.swa.kv_buffer, window),
    ):
        buffer[:, index] = torch.randn_like(buffer[:, index].float()).to(buffer.dtype)
    for state in (r.mamba.temporal_buffer, *r.mamba.conv_buffer):
        state[slot] = torch.randn_like(state[slot].float()).to(state.dtype)


def states(r: Rank, slot: torch.Tensor) -> list[torch.Tensor]:
    return [s[slot].clone() for s in (r.mamba.temporal_buffer, *r.mamba.conv_buffer)]


def publish(
    w: Rank, keys: list[str], kv_pages: int, window: list[int], checkpoints: list[int]
) -> tuple[torch.Tensor, torch.Tensor, dict[int, torch.Tensor]]:
    """Publishes as SGLang's backup does: the KV pages of `keys[:kv_pages]`, the window pages
    `window` (page numbers) and a Mamba state at the end of each page in `checkpoints`."""
    kv = w.alloc(kv_pages)
    win = w.swa.alloc(len(window) * PAGE)
    slots = {n: w.mamba.alloc(1) for n in checkpoints}
    fill(w, kv, win, torch.cat(list(slots.values())) if slots else torch.empty(0, dtype=torch.long))
    b = w.backend
    assert b.batch_set_v1(keys[:kv_pages], kv, info([])) == [True] * kv_pages
    if window:
        first = window[0]
        got = b.batch_set_v2([swa(win, keys[first : first + len(window)])], info(keys[:first]))
        assert got == {str(PoolName.SWA): [True] * len(window)}
    for n, slot in slots.items():
        got = b.batch_set_v2([mamba(slot, keys[n])], info(keys[:n]))
        assert got == {str(PoolName.MAMBA): [True]}
    assert b.wait_durable(10.0)
    return kv, win, slots


def exists(r: Rank, keys: list[str]) -> tuple[int, list[int] | None]:
    result = r.backend.batch_exists_v2(
        keys,
        [swa(None, keys[-WINDOW_PAGES:]), mamba(None, keys[-1])],
        info([]),
    )
    return result.kv_hit_pages, result.restorable_prefix_pages


def test_kv_window_and_mamba_state_round_trip(ranks: tuple[Rank, Rank]) -> None:
    w, r = ranks
    keys = w.keys(TOKENS)
    kv, win, slots = publish(w, keys, 6, [3, 4, 5], [5])
    assert exists(r, keys) == (6, [6])
    # SGLang loads the KV pages first (v1), then each pool's trailing pages (v2).
    kv_r = r.alloc(6)
    assert r.backend.batch_get_v1(keys, kv_r, info([])) == [True] * 6
    assert same_bytes(r.host.kv_buffer[:, kv_r], w.host.kv_buffer[:, kv])
    win_r = r.swa.alloc(WINDOW_PAGES * PAGE)
    got = r.backend.batch_get_v2([swa(win_r, keys[3:])], info(keys[:3]))
    assert got == {str(PoolName.SWA): [True] * WINDOW_PAGES}
    assert same_bytes(r.swa.kv_buffer[:, win_r], w.swa.kv_buffer[:, win])
    slot_r = r.mamba.alloc(1)
    got = r.backend.batch_get_v2([mamba(slot_r, keys[5])], info(keys[:5]))
    assert got == {str(PoolName.MAMBA): [True]}
    for a, b in zip(states(r, slot_r), states(w, slots[5]), strict=True):
        assert same_bytes(a, b)


def test_kv_pages_load_in_batches_whatever_their_ends(ranks: tuple[Rank, Rank]) -> None:
    """SGLang loads a long prefix's KV pages in batches (128 pages each), the hashes before
    each batch in `prefix_keys`: a batch's end need not be a window or checkpoint boundary."""
    w, r = ranks
    keys = w.keys([t + 4 for t in TOKENS])
    kv, _, _ = publish(w, keys, 6, [3, 4, 5], [5])
    kv_r = r.alloc(6)
    assert r.backend.batch_get_v1(keys[:4], kv_r[: 4 * PAGE], info([])) == [True] * 4
    assert r.backend.batch_get_v1(keys[4:], kv_r[4 * PAGE :], info(keys[:4])) == [True] * 2
    assert same_bytes(r.host.kv_buffer[:, kv_r], w.host.kv_buffer[:, kv])


def test_a_hit_only_where_every_pool_holds(ranks: tuple[Rank, Rank]) -> None:
    """KV for 6 pages, the window of pages 1..3 and a Mamba state at the end of page 3: the
    one boundary proven is 4 pages, not 6 (no state there) nor 5 (no window, no state)."""
    w, r = ranks
    keys = w.keys([t + 1 for t in TOKENS])
    publish(w, keys, 6, [1, 2, 3], [3])
    assert exists(r, keys) == (4, [4])
    # A load at the end of the chain (page 6) is not proven: nothing is loaded.
    slot_r = r.mamba.alloc(1)
    got = r.backend.batch_get_v2([mamba(slot_r, keys[5])], info(keys[:5]))
    assert got == {str(PoolName.MAMBA): [False]}


def test_a_window_missing_one_page_is_no_hit(ranks: tuple[Rank, Rank]) -> None:
    """The Mamba state at page 6 with only 2 of the window's 3 pages: a miss."""
    w, r = ranks
    keys = w.keys([t + 2 for t in TOKENS])
    publish(w, keys, 6, [4, 5], [5])
    assert exists(r, keys) == (0, [])
    # The v1 call asks about the KV pages alone (SGLang's KV-only prefetch).
    assert r.backend.batch_exists(keys, info([])) == 6


def test_no_kv_prefix_no_hit(ranks: tuple[Rank, Rank]) -> None:
    """The window and the state at page 6 but the KV pages of only the first 5: a miss."""
    w, r = ranks
    keys = w.keys([t + 3 for t in TOKENS])
    publish(w, keys, 5, [3, 4, 5], [5])
    assert exists(r, keys) == (0, [])


def test_a_pool_not_registered_is_a_miss(daemon: Daemon, model_dir: Path) -> None:
    """A full-attention rank asked about a Mamba pool it never registered answers a miss, and
    stores nothing of it."""
    r = Rank(model_dir, "no-sidecars", daemon.socket)
    try:
        keys = r.keys(TOKENS)
        result = r.backend.batch_exists_v2(keys, [mamba(None, keys[-1])], info([]))
        assert result.kv_hit_pages == 0
        got = r.backend.batch_set_v2([mamba(torch.tensor([0]), keys[-1])], info(keys[:-1]))
        assert got == {str(PoolName.MAMBA): [False]}
    finally:
        r.close()
