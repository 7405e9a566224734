"""The worker side: its rank's pool, the loads the scheduler's leases prove (asynchronous: the
requests they serve are computed in a later step) and the publishes of the blocks each step
filled (after it).

The pool is vLLM's own KV memory where the daemon can reach it, else a staging copy
(`orbitkv.vllm.pages`). A page gets a new generation before each copy into it or out of it, so
a late daemon copy never lands in a page reused since."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orbitkv
from orbitkv.session import (
    Registration,
    Session,
    chunks,
    session_gone,
    settle,
    take_replies,
)
from orbitkv.vllm import weights
from orbitkv.vllm.metadata import OrbitKVMetadata
from orbitkv.vllm.pages import POOL, Fence, PageMemory, StagedMemory, page_memory
from orbitkv.vllm.settings import (
    PageShape,
    Settings,
    identity,
    kv_groups,
    record_rank,
    rules,
    state_format,
    storage_layout,
)
from orbitkv.vllm.stats import Counters

if TYPE_CHECKING:
    import torch
    from vllm.v1.kv_cache_interface import KVCacheConfig

log = logging.getLogger("orbitkv.vllm")

# How long a step's Load may take before its pages count as failed (vLLM recomputes them).
LOAD_WAIT = 30.0
# How long a publish may wait for its pages to be copied out (a preemption waits for it this
# long): past it, its pages are revoked (the daemon discards a late copy) and its blocks freed.
COPIED_WAIT = 30.0


# One page of a Publish: group, rank, hash, parent, start, end, pool, block, generation.
PublishPage = tuple[int, int, bytes, bytes, int, int, int, int, int]


@dataclass
class Published:
    """A Publish in flight: its request id on connection `conn` (sent at `sent`, monotonic),
    the vLLM requests it serves and the blocks it copies out of."""

    request_id: int
    requests: set[str]
    blocks: list[int]
    conn: orbitkv.Connection
    sent: float


@dataclass
class Pending:
    """A Publish waiting for the step that wrote its blocks to finish on the device."""

    fence: Fence
    pages: list[PublishPage]
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
        self.groups = kv_groups(kv_cache_config, layout, settings.pipeline)
        self.shapes: dict[int, PageShape] = {g.group: g for g in self.groups}
        if kv_cache_config is None:
            raise RuntimeError("kv_groups refuses a missing KV cache configuration")
        self.num_blocks = int(kv_cache_config.num_blocks)
        self.layer_bytes = self.groups[0].layer_bytes
        self.memory: PageMemory | None = None
        self.pool_ready = False
        self.session = Session(
            settings.socket,
            Registration(
                instance=settings.instance,
                role="worker",
                rank=rank,
                workers=settings.workers,
                identity=identity(settings, self.groups, attention_backend),
                layout=storage_layout(settings, self.groups, attention_backend),
                domain=settings.domain,
                model=settings.model,
                revision=settings.revision,
                formats=tuple(
                    state_format(settings, g, rank, attention_backend).encode() for g in self.groups
                ),
                rules=rules(self.groups),
                client="orbitkv-vllm",
            ),
            on_seal=self._register_pool,
        )
        self.pending: list[Pending] = []
        self.in_flight: list[Published] = []
        # Publishes copied out, waiting for their PublishDurable.
        self.durable_wait: list[Published] = []
        self.had_publish: set[str] = set()
        self.finished_waiting: set[str] = set()
        self.load_errors: set[int] = set()
        # The requests whose loads ran, and those whose load failed as a whole (several groups).
        self.received: set[str] = set()
        self.failed_receiving: set[str] = set()
        # The handshake's content, in the first step's worker metadata.
        self.backend_told = False
        # (epoch, lease) pairs whose loads this rank ran since its last worker metadata.
        self.loaded_leases: set[tuple[int, int]] = set()
        # Pages a Load's reply never came for that stayed leased past the wait, and that Load's
        # connection: a copy into them may still land, so they are not reused while leased by
        # a daemon that may still run.
        self.abandoned: dict[int, orbitkv.Connection] = {}
        # The step's device work queued before its forward pass, which its loads wait for
        # (taken in `handle_preemptions`; vLLM starts asynchronous loads after the forward).
        self.load_fence: Fence | None = None
        # vLLM zeroes the blocks it hands out before the next step's connector calls
        # (Mamba models, under its model runner V2): a publish is copied out within its step.
        self.copied_in_step = bool(
            getattr(kv_cache_config, "needs_kv_cache_zeroing", False)
            or any(g.kind == "mamba" for g in self.groups)
        )
        weights.watch_vllm_workers()
        self.stats = Counters(
            "loaded_bytes",
            "published_bytes",
            "load_failures",
            "durable_pages",
            "held_pages",
            "publish_failures",
        )

    # -- the pool ----------------------------------------------------------------------------

    def register(self, kv_caches: dict[str, torch.Tensor]) -> None:
        """vLLM's per-layer views (this rank's stage): its pool, in place or staged."""
        groups = {
            g.group: [kv_caches[n] for n in g.layer_names if n in kv_caches] for g in self.groups
        }
        if len(self.groups) == 1 and not groups[self.groups[0].group]:
            groups = {self.groups[0].group: list(kv_caches.values())}
        self.memory = page_memory(groups, self.layer_bytes, self.num_blocks)
        log.info("OrbitKV: rank %d's pool is %s", self.rank, self.memory.kind)
        self.session.sealed()

    @property
    def pool(self) -> orbitkv.HostPool | None:
        """The pool's state words (every page's generation and leases)."""
        return self.memory.states if self.memory is not None else None

    def _register_pool(self, conn: orbitkv.Connection, seal: orbitkv.Sealed) -> None:
        self.pool_ready = False
        m = self.memory
        if m is None:
            return
        try:
            m.register(conn, seal.token)
        except orbitkv.RefusedError as e:
            if m.kind != "device":
                raise
            # A daemon without the CUDA backend, driver or device: stage instead.
            log.warning("OrbitKV: the daemon refused the device pool (%s); staging instead", e)
            try:
                staged = StagedMemory(m.groups, self.layer_bytes, self.num_blocks)
            except (orbitkv.OrbitKVError, OSError, RuntimeError, ValueError) as err:
                # Host memory for the staging pool could not be had: this rank serves and
                # publishes nothing, and the engine runs on.
                log.error("OrbitKV: no staging pool (%s); this rank recomputes everything", err)
                return
            self.memory = m = staged
            m.register(conn, seal.token)
        self.pool_ready = True

    def _live(self) -> tuple[orbitkv.Connection, orbitkv.Sealed] | None:
        seal = self.session.sealed()
        if seal is None or self.session.conn is None or not self.pool_ready:
            return None
        return self.session.conn, seal

    def _fresh(self, block: int) -> int | None:
        """A new generation of pool page `block`, after the daemon's copies out of it (waited
        for up to `COPIED_WAIT`, then revoked: the daemon discards a late copy); `None` when
        the page cannot be had."""
        pool = self.pool
        if pool is None:
            return None
        try:
            generation = pool.reuse(block)
            self.abandoned.pop(block, None)
            return generation
        except orbitkv.OrbitKVError:
            pass
        conn = self.abandoned.get(block)
        if conn is not None and conn.daemon_state() != "gone":
            # A copy into it may still land: skipped while leased, never revoked.
            log.warning("OrbitKV: pool page %d stays leased by a Load; its block is skipped", block)
            return None
        self.abandoned.pop(block, None)
        if block in self._busy_blocks():
            self._poll(COPIED_WAIT)
            self._give_up([p for p in self.in_flight if block in p.blocks])
            try:
                return pool.reuse(block)
            except orbitkv.OrbitKVError:
                pass
        # Leased by no copy of this rank's: a daemon gone mid-copy, or a copy given up on.
        try:
            generation = pool.revoke(block)
        except orbitkv.OrbitKVError as e:
            log.warning("OrbitKV: pool page %d cannot be had (%s); its block is skipped", block, e)
            return None
        log.warning("OrbitKV: pool page %d stayed leased by no copy of this rank's; revoked", block)
        return generation

    # -- vLLM's worker calls -------------------------------------------------------------------

    def load(self, meta: OrbitKVMetadata) -> None:
        """The step's loads (vLLM computes their requests in a later step); a page not loaded
        is a load error."""
        # Device memory: once a step, the daemon's copies wait for the work queued before the
        # step's forward pass (a block handed out may still be read by a step in flight).
        stream_done = False
        fence, self.load_fence = self.load_fence, None
        for spec in meta.loads:
            if spec.lease:
                self.loaded_leases.add((spec.epoch, spec.lease))
            failed: list[int] = list(spec.lost)
            mine = [p for p in spec.pages if p[3] == record_rank(self.shapes[p[0]], self.rank)]
            live = self._live() if mine else None
            # Records of the weights this instance started with are not its KV any more. A
            # lease of another epoch ended with it (its id may name another lease now).
            if mine and (
                live is None
                or self.memory is None
                or weights.changed()
                or live[1].epoch != spec.epoch
            ):
                failed += [block for _, _, block, _ in mine]
                self.stats.add("load_failures", len(mine))
            elif live is not None and self.memory is not None:
                if not stream_done:
                    if fence is not None:
                        fence.synchronize()
                    else:
                        self.memory.before_load()
                    stream_done = True
                failed += self._load_pages(live, spec.lease, mine)
            # Asynchronous: vLLM computes the request once every rank has reported it.
            self.received.add(spec.request)
            if spec.whole and failed:
                self.failed_receiving.add(spec.request)
            elif failed:
                self.load_errors.update(failed)

    def _load_pages(
        self,
        live: tuple[orbitkv.Connection, orbitkv.Sealed],
        lease: int,
        mine: list[tuple[int, int, int, int]],
    ) -> list[int]:
        """Loads `mine` (group, index, block, rank) under `lease`; the blocks not loaded."""
        conn, seal = live
        failed, pages, staged = [], [], []
        for group, index, block, rank in mine:
            generation = self._fresh(block)
            if generation is None:
                failed.append(block)
                self.stats.add("load_failures")
                continue
            staged.append((group, block))
            pages.append((index, group, rank, POOL, block, generation, 0, self._layers(group)))
        if not pages:
            return failed
        try:
            statuses = conn.wait(
                conn.submit_load(seal.token, seal.epoch, lease, pages), timeout=LOAD_WAIT
            )
        except orbitkv.RefusedError as e:
            # The whole Load refused (a lease given back or expired): nothing was copied, and
            # the connection stays unless the refusal says the session is gone.
            log.warning("OrbitKV: a load was refused (%s); its blocks are recomputed", e)
            if session_gone(e):
                self.session.lost(str(e), conn)
            statuses = None
        except orbitkv.OrbitKVError as e:
            self.session.lost(str(e))
            statuses = None
        if (
            not isinstance(statuses, orbitkv.Pages)
            or len(statuses.statuses) != len(staged)
            or self.memory is None
        ):
            # No reply: the daemon may still copy. vLLM recomputes into these blocks.
            blocks = [block for _, block in staged]
            self._settle(blocks, copying_in=conn)
            pool = self.pool
            if pool is not None:
                for block in blocks:
                    if pool.leases(block):
                        self.abandoned[block] = conn
            self.stats.add("load_failures", len(staged))
            return failed + [block for _, block in staged]
        for (group, block), status in zip(staged, statuses.statuses, strict=True):
            if status == "ok":
                self.memory.after_load(group, block)
                self.stats.add("loaded_bytes", self.layer_bytes * self._layers(group))
            else:
                failed.append(block)
                self.stats.add("load_failures")
                self.stats.add(f"load_{status}")
        return failed

    def save(self, meta: OrbitKVMetadata) -> None:
        """The step's publishes, once its forward pass has written the blocks: at once for
        host memory, after the step's CUDA event for device memory (with async scheduling
        the step may still run)."""
        if not meta.publishes:
            self._poll()
            return
        requests = {p.request for p in meta.publishes}
        self.had_publish.update(requests)
        # Taken after `_live`: a registration on reconnect may replace the memory.
        live = self._live()
        m = self.memory
        if live is None or m is None or weights.changed():
            self._poll()
            return
        pages = []
        for p in meta.publishes:
            rank = record_rank(self.shapes[p.group], self.rank)
            # MLA's one copy for every rank is rank 0's to publish.
            if rank != self.rank and self.rank != 0:
                continue
            generation = self._fresh(p.block)
            if generation is None:
                continue
            m.before_publish(p.group, p.block)
            pages.append(
                (p.group, rank, p.hash, p.parent, p.start, p.end, POOL, p.block, generation)
            )
        if not pages:
            return
        fence = m.fence()
        if fence is None:
            self._submit(pages, requests)
        else:
            self.pending.append(Pending(fence, pages, requests))
        if self.copied_in_step:
            self._poll(COPIED_WAIT)
            # vLLM may zero these blocks before the next step: a copy not out now never is.
            self._give_up(list(self.in_flight))
        else:
            self._poll()

    def _submit(self, pages: list[PublishPage], requests: set[str]) -> None:
        """Publishes `pages`, in Publishes the daemon's per-request limits take."""
        live = self._live()
        if live is None:
            return
        conn, seal = live
        sizes = [self.layer_bytes * self._layers(p[0]) for p in pages]
        for part in chunks(sizes):
            mine = [pages[i] for i in part]
            try:
                rid = conn.submit_publish(seal.token, seal.epoch, mine)
            except orbitkv.OrbitKVError as e:
                self.session.lost(str(e))
                return
            self.in_flight.append(
                Published(rid, requests, [p[7] for p in mine], conn, time.monotonic())
            )
            self.stats.add("published_bytes", sum(sizes[i] for i in part))

    def _flush(self, wait: bool) -> None:
        """Sends the pending publishes whose step has finished (with `wait`, all of them)."""
        still = []
        for p in self.pending:
            if wait:
                p.fence.synchronize()
            if wait or p.fence.query():
                self._submit(p.pages, p.requests)
            else:
                still.append(p)
        self.pending = still

    def _settle(
        self,
        blocks: list[int],
        copying_in: orbitkv.Connection | None = None,
        via: orbitkv.Connection | None = None,
        timeout: float = COPIED_WAIT,
    ) -> None:
        """Lets go of `blocks` after a Load (`copying_in`, its connection) or Publish (`via`)
        whose reply will not come, before vLLM reuses them."""
        if blocks and self.pool is not None:
            settle(self.pool, blocks, timeout, copying_in, via=via)

    def _give_up(self, entries: list[Published]) -> None:
        """Stops waiting for these publishes' copies: their pages are revoked at once (the
        daemon discards a late copy) and their blocks count as copied out."""
        for p in entries:
            self._settle(p.blocks, via=p.conn, timeout=0.0)
            # Its replies, should they come, are not kept.
            p.conn.forget(p.request_id)
            self.stats.add("publish_failures", len(p.blocks))
        gone = {id(p) for p in entries}
        self.in_flight = [p for p in self.in_flight if id(p) not in gone]

    def _poll(self, timeout: float = 0.0) -> None:
        """Sends the publishes whose step has finished (waiting for them all when `timeout` is
        not 0), takes the PublishCopied replies that have come (waiting up to `timeout` for
        all), and the PublishDurable replies that have come."""
        self._flush(wait=timeout > 0)
        conn = self.session.conn
        current = conn if conn is not None and conn.closed is None else None
        for p in self.in_flight:
            if p.conn is not current:
                # Its connection is gone with its PublishCopied reply (a reconnect numbers
                # requests again): the blocks are freed once the daemon holds none of them.
                self._settle(p.blocks, via=p.conn)
        self.in_flight = [p for p in self.in_flight if p.conn is current]
        self.in_flight, copied = self._replies(self.in_flight, timeout)
        self.durable_wait += [p for p, _ in copied]
        self.durable_wait, durable = self._replies(self.durable_wait, 0.0)
        self._count(durable)
        # A daemon that holds the connection but copies nothing does not keep blocks for good.
        now = time.monotonic()
        self._give_up([p for p in self.in_flight if now - p.sent >= COPIED_WAIT])

    def wait_durable(self, timeout: float) -> bool:
        """Waits until every publish is durable (or `timeout`); true when none is left."""
        self._poll(timeout)
        self.durable_wait, durable = self._replies(self.durable_wait, timeout)
        self._count(durable)
        return not self.pending and not self.in_flight and not self.durable_wait

    def _count(self, durable: list[tuple[Published, Any]]) -> None:
        for _, reply in durable:
            if isinstance(reply, orbitkv.Pages):
                for status in reply.statuses:
                    if status == "ok":
                        self.stats.add("durable_pages")
                    elif status == "held":
                        # Stored in the daemon's DRAM for SSD admission: readable, not durable.
                        self.stats.add("held_pages")
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
        waiting = [p for p in waiting if p.conn is conn]
        left, replies = take_replies(conn, [p.request_id for p in waiting], timeout)
        still = [p for p in waiting if p.request_id in left]
        arrived = [(p, replies[p.request_id]) for p in waiting if p.request_id in replies]
        return still, arrived

    def preempted(self, meta: OrbitKVMetadata) -> None:
        """Before the step writes: vLLM frees a preempted request's blocks at once, and may
        hand out a block a publish still copies (a sliding-window block that left the window):
        those copies must be out first. The step's loads wait for the device work queued now."""
        self.load_fence = self.memory.fence() if meta.loads and self.memory is not None else None

        def touched(p: Published) -> bool:
            return bool(p.requests & meta.preempted or meta.allocated.intersection(p.blocks))

        if self._busy() & meta.preempted or self._busy_blocks() & meta.allocated:
            self._poll(COPIED_WAIT)
            # Copies not out by now are given up on: vLLM writes these blocks next.
            self._give_up([p for p in self.in_flight if touched(p)])
        # Their blocks are freed: the scheduler side waits for nothing more of theirs.
        self.had_publish -= meta.preempted

    def _busy_blocks(self) -> set[int]:
        """Blocks a publish not yet copied out reads."""
        busy = {page[7] for p in self.pending for page in p.pages}
        for q in self.in_flight:
            busy.update(q.blocks)
        return busy

    def _busy(self) -> set[str]:
        """Requests with a publish not yet copied out of their blocks."""
        busy: set[str] = set()
        for p in self.pending:
            busy |= p.requests
        for q in self.in_flight:
            busy |= q.requests
        return busy

    def finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        """Requests whose blocks may be freed: every publish of theirs copied out."""
        self.finished_waiting |= finished_req_ids & self.had_publish
        self._poll()
        busy = self._busy()
        done = {r for r in self.finished_waiting if r not in busy}
        self.finished_waiting -= done
        self.had_publish -= done
        return (done or None), None

    def take_load_errors(self) -> set[int]:
        errors, self.load_errors = self.load_errors, set()
        return errors

    def take_received(self) -> tuple[set[str], set[str]]:
        """The asynchronous loads done since the last call, and those of them that failed."""
        done, failed = self.received, self.failed_receiving
        self.received, self.failed_receiving = set(), set()
        return done, failed

    def take_loaded(self) -> frozenset[tuple[int, int]]:
        """The (epoch, lease) pairs whose loads ran since the last call."""
        leases, self.loaded_leases = frozenset(self.loaded_leases), set()
        return leases

    def tell_backend(self) -> frozenset[str]:
        """The attention backend, once: the first step's worker metadata carries it."""
        if self.backend_told:
            return frozenset()
        self.backend_told = True
        return frozenset({self.backend})

    def _layers(self, group: int) -> int:
        return len(self.memory.groups.get(group, ())) if self.memory is not None else 0

    def close(self) -> None:
        self.session.close()
        self.memory = None
