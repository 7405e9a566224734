"""SGLang's own HiCache controller over the backend, on a single-process gloo group: the
`HybridCacheController` `UnifiedRadixCache` builds for an MHA model, which creates the backend
itself from the storage settings it parses. Server A's backup thread stores three host pages
through the backend; server B's prefetch threads (the hit query, then the page reads) load them
into B's host pool byte-exact, from the root and below a page B already holds (the hashes before
the call's keys, `prefix_keys`, place the pages). The test plays the scheduler between the
controller's queues, as `UnifiedRadixCache` does."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from queue import Empty, Queue
from typing import TypeVar

import pytest
import torch
import torch.distributed as dist
from daemon import Daemon
from harness import LAYERS, PAGE, Rank, same_bytes
from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator
from sglang.srt.mem_cache.base_prefix_cache import CacheRequestHandle
from sglang.srt.mem_cache.hicache_storage import PoolName
from sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller import (
    HybridCacheController,
    PrefetchOperation,
)
from sglang.srt.mem_cache.hybrid_cache.hybrid_pool_assembler import build_pool_entry
from sglang.srt.mem_cache.pool_host import HostPoolGroup
from sglang.srt.mem_cache.utils import get_storage_hash_str
from sglang.srt.runtime_context import get_memory, get_parallel, get_serving

TOKENS = [(i * 43 + 17) % 1000 for i in range(3 * PAGE)]
# How long a controller thread has to answer, at most.
WAIT = 10.0

T = TypeVar("T")
Server = tuple[Rank, HybridCacheController]


@pytest.fixture(scope="module")
def group() -> Iterator[dist.ProcessGroup]:
    """The one rank's gloo group (SGLang hands its controller the TP group's), for this module
    only."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield dist.group.WORLD
    finally:
        dist.destroy_process_group()


@pytest.fixture
def servers(
    daemon: Daemon, model_dir: Path, group: dist.ProcessGroup
) -> Iterator[Callable[[str], Server]]:
    """Starts a server's controller by instance name; every controller's storage threads are
    stopped and its backend closed at the end (SGLang's detach at shutdown)."""
    started: list[HybridCacheController] = []

    def start(instance: str) -> Server:
        # The rank publishes the server arguments and builds the pools; its own backend gives
        # way to the one the controller creates (a second registration of the instance).
        rank = Rank(model_dir, instance, daemon.socket, extra={"prefetch_threshold": PAGE})
        rank.close()
        started.append(controller(rank, group))
        return rank, started[-1]

    yield start
    for c in started:
        c.detach_storage_backend()


def controller(rank: Rank, group: dist.ProcessGroup) -> HybridCacheController:
    """What `build_kv_only_stack` builds for `UnifiedRadixCache`, over the rank's pools (SGLang's
    own host pool is pinned, which needs CUDA), with the settings it parses from the published
    extra config: `hicache_storage_pass_prefix_keys` and `prefetch_threshold` are taken out of
    the backend's config there."""
    memory = get_memory()
    config, threshold, *_ = HybridCacheController.parse_storage_backend_extra_config(
        memory.hicache_storage_backend_extra_config
    )
    entry = build_pool_entry(
        name=PoolName.KV,
        host_pool=rank.host,
        device_pool=rank.device,
        layer_mapping={layer: layer for layer in range(LAYERS)},
        transfer_layer_id_max=LAYERS,
        is_anchor=True,
    )
    allocator = PagedTokenToKVPoolAllocator(
        size=rank.device.size,
        page_size=rank.page,
        dtype=rank.device.dtype,
        device="cpu",
        kvcache=rank.device,
        need_sort=False,
    )
    # The ranks SGLang's launcher records (the widths come from the published arguments); the
    # controller reads them while it builds its storage config.
    with get_parallel().override(tp_rank=0, attn_tp_rank=0, attn_dp_rank=0, pp_rank=0):
        return HybridCacheController(
            allocator,
            HostPoolGroup([entry]),
            rank.page,
            group,
            load_cache_event=threading.Event(),
            write_policy=memory.hicache_write_policy,
            io_backend=memory.hicache_io_backend,
            storage_backend=memory.hicache_storage_backend,
            prefetch_threshold=threshold,
            model_name=get_serving().served_model_name,
            storage_backend_extra_config=config,
            transfer_layer_id_max=LAYERS,
            host_memory_mode=memory.hicache_host_memory_mode,
        )


def take(queue: Queue[T], what: str) -> T:
    try:
        return queue.get(timeout=WAIT)
    except Empty:
        pytest.fail(f"no {what} within {WAIT} s")


def backup(
    c: HybridCacheController, host_indices: torch.Tensor, tokens: list[int], keys: list[str]
) -> int:
    """Stores the host pages through the backup thread, from the root: the tokens stored."""
    op_id = c.write_storage(host_indices, tokens, keys, prefix_keys=[])
    done = take(c.ack_backup_queue, "backup ack")
    assert done.id == op_id
    return int(done.completed_tokens)


def prefetch(
    c: HybridCacheController, rid: str, tokens: list[int], prefix_keys: list[str]
) -> PrefetchOperation:
    """Loads `tokens` after the pages `prefix_keys` hash into the host pool, as the scheduler
    drives it: the hit query's answer is given host pages, and the reads are acknowledged."""
    last_hash = prefix_keys[-1] if prefix_keys else None
    op = c.prefetch(CacheRequestHandle(rid=rid, attempt_id=0), tokens, last_hash, prefix_keys)
    hit = take(c.prefetch_hit_queue, "hit query")
    assert hit is op and not op.is_terminated()
    assert op.storage_hit_count >= c.prefetch_threshold, "the server would not fetch it"
    op.host_indices, op.storage_hit_count = c.allocate_storage_hit(
        op,
        op.storage_hit_count,
        allow_partial=True,
        min_tokens=c.prefetch_threshold,
        evict_host=lambda tokens: 0,  # no radix tree holds host pages to evict
    )
    assert op.host_indices is not None, "host pool full"
    c.prefetch_buffer.put(op)
    while True:
        ack = take(c.ack_prefetch_queue, "prefetch ack")
        assert ack.operation is op
        if ack.completed_tokens is not None:
            op.completed_tokens = ack.completed_tokens
        if ack.completed_req:
            return op


def test_one_servers_backup_thread_stores_what_anothers_prefetch_loads(
    servers: Callable[[str], Server],
) -> None:
    a, writer = servers("ctl-writer")
    keys = get_storage_hash_str(TOKENS, None, page_size=PAGE)
    idx = a.alloc(3)
    data = a.fill(idx, b"controller")
    assert backup(writer, idx, TOKENS, keys) == 3 * PAGE
    assert writer.storage_backend.counters()["published_pages"] == 3
    # Durable before another server reads (the backup thread never waits for it).
    assert writer.storage_backend.wait_durable(WAIT)

    b, reader = servers("ctl-reader")
    op = prefetch(reader, "whole", TOKENS, [])
    assert op.completed_tokens == 3 * PAGE
    assert same_bytes(b.kv(op.host_indices), data), "byte-exact"
    # The tail alone, below the first page.
    op = prefetch(reader, "tail", TOKENS[PAGE:], keys[:1])
    assert op.hash_value == keys[1:] and op.completed_tokens == 2 * PAGE
    assert same_bytes(b.kv(op.host_indices), data[:, :, PAGE:])
    assert reader.storage_backend.counters()["loaded_pages"] == 5
