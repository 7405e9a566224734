"""The worker side: its rank's pool, the loads the scheduler's leases prove (before the forward
pass) and the publishes of the blocks each step filled (after it).

KV caches in ordinary CPU memory are staged through a host pool this rank owns: one copy each
way, between vLLM's page (every layer of the rank's stage) and the pool page of the same index.
A pool page gets a new generation before each copy into it, so a late daemon copy never lands in
a page reused since."""

from __future__ import annotations

import logging
import mmap
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orbitkv
from orbitkv.vllm import weights
from orbitkv.vllm.metadata import OrbitKVMetadata
from orbitkv.vllm.session import Registration, Session
from orbitkv.vllm.settings import (
    GROUP,
    PageShape,
    Settings,
    identity,
    page_shape,
    state_format,
    storage_layout,
)
from orbitkv.vllm.stats import Counters

if TYPE_CHECKING:
    import torch
    from vllm.v1.kv_cache_interface import KVCacheConfig

log = logging.getLogger("orbitkv.vllm")

# The staging pool's id.
POOL = 1
# How long a step's Load may take before its pages count as failed (vLLM recomputes them).
LOAD_WAIT = 30.0
# How long a preemption waits for publishes still being copied out of its blocks.
COPIED_WAIT = 30.0


@dataclass
class Published:
    """A Publish in flight: its request id with the daemon and the vLLM requests it serves."""

    request_id: int
    requests: set[str]


class WorkerSide:
    """The connector's worker-role state for one rank."""

    def __init__(
        self,
        settings: Settings,
        kv_cache_config: KVCacheConfig | None,
        layout: str | None,
        rank: int,
        attention_backend: str,
    ) -> None:
        self.s = settings
        self.rank = rank
        self.backend = attention_backend
        self.shape: PageShape = page_shape(kv_cache_config, layout)
        if kv_cache_config is None:
            raise RuntimeError("page_shape refuses a missing KV cache configuration")
        self.num_blocks = int(kv_cache_config.num_blocks)
        self.layer_names: list[str] = list(kv_cache_config.kv_cache_groups[0].layer_names)
        self.layers: list[torch.Tensor] = []
        self.pool: orbitkv.HostPool | None = None
        self.pages: torch.Tensor | None = None
        self._map: mmap.mmap | None = None
        self.pool_ready = False
        self.session = Session(
            settings.socket,
            Registration(
                instance=settings.instance,
                role="worker",
                rank=rank,
                workers=settings.workers,
                identity=identity(settings, self.shape, attention_backend),
                layout=storage_layout(settings, self.shape, attention_backend),
                domain=settings.domain,
                model=settings.model,
                revision=settings.revision,
                formats=(state_format(settings, self.shape, rank, attention_backend).encode(),),
            ),
            on_seal=self._register_pool,
        )
        self.in_flight: list[Published] = []
        # Publishes copied out, waiting for their PublishDurable.
        self.durable_wait: list[Published] = []
        self.had_publish: set[str] = set()
        self.finished_waiting: set[str] = set()
        self.load_errors: set[int] = set()
        weights.watch_vllm_workers()
        self.stats = Counters(
            "loaded_bytes", "published_bytes", "load_failures", "durable_pages", "publish_failures"
        )

    # -- the pool ----------------------------------------------------------------------------

    def register(self, kv_caches: dict[str, torch.Tensor]) -> None:
        """vLLM's per-layer views (this rank's stage): a staging pool of as many pages."""
        import torch

        names = [n for n in self.layer_names if n in kv_caches] or list(kv_caches)
        self.layers = [kv_caches[n] for n in names]
        lb = self.shape.layer_bytes
        page = lb * len(self.layers)
        spec = orbitkv.PoolSpec(
            pool=POOL,
            page_bytes=page,
            pages=self.num_blocks,
            groups=[
                orbitkv.GroupGeometry.packed(
                    group=GROUP,
                    layers=len(self.layers),
                    offset=0,
                    layer_stride=lb,
                    layer_bytes=lb,
                    page_bytes=page,
                )
            ],
        )
        self.pool = orbitkv.HostPool(spec)
        size = self.pool.data_offset + page * self.num_blocks
        self._map = mmap.mmap(self.pool.fd, size)
        data = torch.frombuffer(self._map, dtype=torch.uint8)
        self.pages = data[self.pool.data_offset :].view(self.num_blocks, len(self.layers), lb)
        self.session.sealed()

    def _register_pool(self, conn: orbitkv.Connection, seal: orbitkv.Sealed) -> None:
        self.pool_ready = False
        if self.pool is None:
            return
        conn.register_pool(seal.token, self.pool)
        self.pool_ready = True

    def _live(self) -> tuple[orbitkv.Connection, orbitkv.Sealed] | None:
        seal = self.session.sealed()
        if seal is None or self.session.conn is None or not self.pool_ready:
            return None
        return self.session.conn, seal

    def _fresh(self, block: int) -> int | None:
        """A new generation of pool page `block` (after the daemon's copies out of it, should
        one still be running); `None` when the page stays leased."""
        if self.pool is None:
            return None
        for attempt in range(2):
            try:
                return self.pool.reuse(block)
            except orbitkv.OrbitKVError:
                if attempt == 0:
                    self._poll(COPIED_WAIT)
        log.warning("OrbitKV: pool page %d stays leased; its block is skipped", block)
        return None

    def _page_bytes(self, layer: torch.Tensor, block: int) -> torch.Tensor:
        """Layer `layer`'s page `block` in memory order (one run: the layouts mapped)."""
        x = layer[block]
        order = sorted(range(x.dim()), key=lambda d: -x.stride(d))
        return x.permute(order)

    def _to_pool(self, block: int) -> None:
        import torch

        if self.pages is None:
            raise RuntimeError("no pool: register_kv_caches has not run")
        for i, layer in enumerate(self.layers):
            src = self._page_bytes(layer, block).contiguous().view(torch.uint8).reshape(-1)
            self.pages[block, i].copy_(src)

    def _from_pool(self, block: int) -> None:
        if self.pages is None:
            raise RuntimeError("no pool: register_kv_caches has not run")
        for i, layer in enumerate(self.layers):
            dst = self._page_bytes(layer, block)
            dst.copy_(self.pages[block, i].view(layer.dtype).view(dst.shape))

    # -- vLLM's worker calls -------------------------------------------------------------------

    def load(self, meta: OrbitKVMetadata) -> None:
        """The step's loads, before its forward pass; a page not loaded is a load error."""
        for spec in meta.loads:
            self.load_errors.update(spec.lost)
            mine = [p for p in spec.pages if p[2] == self.rank]
            if not mine:
                continue
            live = self._live()
            # Records of the weights this instance started with are not its KV any more.
            if live is None or self.pool is None or weights.changed():
                self.load_errors.update(block for _, block, _ in mine)
                self.stats.add("load_failures", len(mine))
                continue
            conn, seal = live
            pages, staged = [], []
            for index, block, rank in mine:
                generation = self._fresh(block)
                if generation is None:
                    self.load_errors.add(block)
                    self.stats.add("load_failures")
                    continue
                staged.append((index, block, rank))
                pages.append((index, GROUP, rank, POOL, block, generation, 0, len(self.layers)))
            mine = staged
            if not pages:
                continue
            try:
                statuses = conn.wait(
                    conn.submit_load(seal.token, seal.epoch, spec.lease, pages), timeout=LOAD_WAIT
                )
            except orbitkv.OrbitKVError as e:
                self.session.lost(str(e))
                statuses = None
            if not isinstance(statuses, orbitkv.Pages):
                self.load_errors.update(block for _, block, _ in mine)
                self.stats.add("load_failures", len(mine))
                continue
            for (_, block, _), status in zip(mine, statuses.statuses, strict=False):
                if status == "ok":
                    self._from_pool(block)
                    self.stats.add("loaded_bytes", self.shape.layer_bytes * len(self.layers))
                else:
                    self.load_errors.add(block)
                    self.stats.add("load_failures")
                    self.stats.add(f"load_{status}")

    def save(self, meta: OrbitKVMetadata) -> None:
        """The step's publishes, once its forward pass has written the blocks."""
        if not meta.publishes:
            self._poll()
            return
        requests = {p.request for p in meta.publishes}
        self.had_publish.update(requests)
        live = self._live()
        if live is None or self.pool is None or weights.changed():
            self._poll()
            return
        conn, seal = live
        pages = []
        for p in meta.publishes:
            generation = self._fresh(p.block)
            if generation is None:
                continue
            self._to_pool(p.block)
            pages.append(
                (GROUP, self.rank, p.hash, p.parent, p.start, p.end, POOL, p.block, generation)
            )
        if not pages:
            return
        try:
            rid = conn.submit_publish(seal.token, seal.epoch, pages)
        except orbitkv.OrbitKVError as e:
            self.session.lost(str(e))
            return
        self.in_flight.append(Published(rid, requests))
        self.stats.add("published_bytes", len(pages) * self.shape.layer_bytes * len(self.layers))
        self._poll()

    def _poll(self, timeout: float = 0.0) -> None:
        """Takes the PublishCopied replies that have come (waiting up to `timeout` for all),
        and the PublishDurable replies that have come."""
        self.in_flight, copied = self._replies(self.in_flight, timeout)
        self.durable_wait += [p for p, _ in copied]
        self.durable_wait, durable = self._replies(self.durable_wait, 0.0)
        self._count(durable)

    def wait_durable(self, timeout: float) -> bool:
        """Waits until every publish is durable (or `timeout`); true when none is left."""
        self._poll(timeout)
        self.durable_wait, durable = self._replies(self.durable_wait, timeout)
        self._count(durable)
        return not self.in_flight and not self.durable_wait

    def _count(self, durable: list[tuple[Published, Any]]) -> None:
        for _, reply in durable:
            if isinstance(reply, orbitkv.Pages):
                for status in reply.statuses:
                    if status == "ok":
                        self.stats.add("durable_pages")
                    else:
                        self.stats.add("publish_failures")
                        self.stats.add(f"publish_{status}")

    def _replies(
        self, waiting: list[Published], timeout: float
    ) -> tuple[list[Published], list[tuple[Published, Any]]]:
        """(the entries of `waiting` whose next reply has not come, the others with it). A lost
        connection drops them all: nothing reads the pages any more."""
        conn = self.session.conn
        if conn is None or conn.closed is not None:
            return [], []
        deadline = time.monotonic() + timeout
        still, arrived = [], []
        for p in waiting:
            try:
                left = deadline - time.monotonic()
                reply = conn.wait(p.request_id, left) if left > 0 else conn.poll(p.request_id)
            except orbitkv.TimedOut:
                reply = None
            except orbitkv.OrbitKVError:
                continue
            if reply is None:
                still.append(p)
            else:
                arrived.append((p, reply))
        return still, arrived

    def preempted(self, meta: OrbitKVMetadata) -> None:
        """vLLM frees a preempted request's blocks at once: their copies must be out first."""
        if any(p.requests & meta.preempted for p in self.in_flight):
            self._poll(COPIED_WAIT)

    def finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        """Requests whose blocks may be freed: every publish of theirs copied out."""
        self.finished_waiting |= finished_req_ids & self.had_publish
        self._poll()
        busy = set().union(*(p.requests for p in self.in_flight)) if self.in_flight else set()
        done = {r for r in self.finished_waiting if r not in busy}
        self.finished_waiting -= done
        self.had_publish -= done
        return (done or None), None

    def take_load_errors(self) -> set[int]:
        errors, self.load_errors = self.load_errors, set()
        return errors

    def close(self) -> None:
        self.session.close()
        if self._map is not None:
            self.pages = None
            self._map = None
