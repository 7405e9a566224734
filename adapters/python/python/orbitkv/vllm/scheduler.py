"""The scheduler side: Query for a request's external tokens (never blocking a step), Acquire
once its blocks are allocated, publishes of the blocks each step fills, and the leases given back
once the workers have loaded."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orbitkv
from orbitkv.session import Registration, Session, session_gone
from orbitkv.vllm.metadata import LoadSpec, OrbitKVMetadata, PublishSpec
from orbitkv.vllm.settings import (
    Settings,
    StartupRefused,
    identity,
    kv_groups,
    rules,
    storage_layout,
)
from orbitkv.vllm.stats import Counters

if TYPE_CHECKING:
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request

log = logging.getLogger("orbitkv.vllm")

# How long a Query may hold up the step before the request is asked again at the next one.
QUERY_WAIT = 0.005
# How long a request may wait for its Query's reply, over all steps, before it counts as a miss.
QUERY_DEADLINE = 1.0
# After a Query passed its deadline, lookups count as misses without asking for this long: a
# daemon that holds its connection open but answers nothing delays one request, not every one.
UNANSWERED_PAUSE = 5.0
# How long the scheduler waits at start-up for its instance's seal.
SEAL_WAIT = 5.0
# How long an Acquire may take before its blocks count as lost (vLLM recomputes them).
ACQUIRE_WAIT = 2.0
# How long a late Acquire's reply is watched for, so that a lease granted after all is given back
# at once rather than holding its records until the daemon's lease TTL.
LATE_ACQUIRE_WATCH = 60.0


@dataclass
class Lookup:
    """A request's last Query: the tokens it held locally (origin), the end asked, the hashes
    asked, the connection and time it was asked on, and the reply's boundary (`None` while the
    reply is pending)."""

    origin: int
    end: int
    hashes: list[bytes]
    request_id: int | None
    conn: orbitkv.Connection | None = None
    asked: float = 0.0
    boundary: int | None = None


class SchedulerSide:
    """The connector's scheduler-role state."""

    def __init__(
        self, settings: Settings, kv_cache_config: KVCacheConfig | None, layout: str | None
    ) -> None:
        self.s = settings
        self.groups = kv_groups(kv_cache_config, layout, settings.pipeline)
        self.block = self.groups[0].block_size
        self.group_ids = {g.group for g in self.groups}
        # Every load is asynchronous: vLLM runs no forward pass over a request's loaded blocks
        # before every rank has loaded them, so no block computed over a failed load is
        # published. Several groups: a failed block cannot be told to vLLM, a failed request
        # can (`whole`).
        self.whole = len(self.groups) > 1
        hash_block = getattr(kv_cache_config, "hash_block_size", None)
        if hash_block not in (None, self.block):
            raise StartupRefused(
                f"OrbitKVConnector: the prefix hash block of {hash_block} tokens differs from the "
                f"block of {self.block}; one block size for hashes and pages is mapped"
            )
        self.session: Session | None = None
        self.requests: dict[str, Request] = {}
        self.lookups: dict[str, Lookup] = {}
        # Each request's local hits at its last lookup: its external blocks start there.
        self.origins: dict[str, int] = {}
        self.loads: list[LoadSpec] = []
        # Leases acquired and not given back yet: (epoch, lease). A lease id is the daemon's
        # count, which starts again at a restart; the epoch tells two apart.
        self.leases: set[tuple[int, int]] = set()
        # Acquires whose reply came too late: (connection, request, watched until).
        self.late: list[tuple[orbitkv.Connection, int, float]] = []
        # Blocks vLLM handed out since the last step's metadata, from `after_alloc`.
        self.handed_out: set[int] = set()
        self.publishing: set[str] = set()
        # Requests whose load failed: vLLM recomputes them, without asking again.
        self.failed: set[str] = set()
        # Requests whose load the workers have not reported yet: the blocks it fills.
        self.loading: dict[str, set[int]] = {}
        # The workers' weights changed in place: nothing is served or published any more.
        self.stale = False
        self.stats = Counters(
            "queries",
            "hit_tokens",
            "acquire_failures",
            "lost_blocks",
            "published_blocks",
            "failed_loads",
            "query_timeouts",
        )
        # Until when lookups count as misses without asking (a Query went unanswered).
        self.unanswered_until = 0.0

    # -- identity, from the workers' handshake ---------------------------------------------------

    def handshake(self, backends: set[str], wait: float = SEAL_WAIT) -> None:
        """The workers' attention backend is known: the instance registers (waiting up to
        `wait` for its seal)."""
        if self.session is not None:
            return
        if len(backends) != 1:
            raise StartupRefused(
                f"OrbitKVConnector: workers chose different attention backends {sorted(backends)}"
            )
        backend = next(iter(backends))
        ident = identity(self.s, self.groups, backend)
        reg = Registration(
            instance=self.s.instance,
            role="scheduler",
            rank=0,
            workers=self.s.workers,
            identity=ident,
            layout=storage_layout(self.s, self.groups, backend),
            domain=self.s.domain,
            model=self.s.model,
            revision=self.s.revision,
            rules=rules(self.groups),
            client="orbitkv-vllm",
        )
        self.session = Session(self.s.socket, reg)
        # The workers registered before they answered the handshake: the seal comes now, at
        # start-up, rather than after the first requests went by.
        self.session.sealed(wait=wait)

    def _named(self, hashes: list[bytes]) -> list[tuple[int, list[bytes]]]:
        """Every group, under the same block hashes: the daemon proves where all of them hold."""
        return [(g.group, hashes) for g in self.groups]

    def _sealed(self) -> tuple[orbitkv.Connection, orbitkv.Sealed] | None:
        if self.session is None:
            return None
        seal = self.session.sealed()
        if seal is None or self.session.conn is None:
            return None
        return self.session.conn, seal

    # -- vLLM's scheduler calls ----------------------------------------------------------------

    def on_new_request(self, request: Request) -> None:
        self.requests[request.request_id] = request

    def matched_tokens(self, request: Request, num_computed_tokens: int) -> tuple[int | None, bool]:
        """External tokens beyond the local hits: exactly the proof's boundary minus them."""
        if (
            self.stale
            or not self.s.consumer
            or getattr(request, "lora_request", None) is not None
            or request.request_id in self.failed
        ):
            return 0, False
        live = self._sealed()
        if live is None:
            return 0, False
        conn, seal = live
        bs = self.block
        end = min(len(request.block_hashes) * bs, request.num_tokens - 1) // bs * bs
        origin = num_computed_tokens
        if end <= origin:
            return 0, False
        now = time.monotonic()
        rid = request.request_id
        self.origins[rid] = origin
        look = self.lookups.get(rid)
        if look is not None and look.boundary is None and look.conn is not conn:
            # Asked on a connection since replaced: its reply never comes on this one.
            look = None
        # A Query went unanswered lately: misses, without asking or waiting.
        paused = now < self.unanswered_until
        if look is None or (look.origin, look.end) != (origin, end):
            if paused:
                return 0, False
            if look is not None and look.request_id is not None:
                conn.forget(look.request_id)
            self.stats.add("queries", 1)
            # Converted once per Query, not at each step the request waits.
            hashes = [bytes(h) for h in request.block_hashes[: end // bs]]
            try:
                q = conn.submit_query(seal.token, seal.epoch, origin, end, self._named(hashes))
            except orbitkv.OrbitKVError as e:
                self._failed(e)
                return 0, False
            look = Lookup(origin, end, hashes, q, conn, now)
            self.lookups[rid] = look
        if look.boundary is None and look.request_id is not None:
            try:
                reply = (
                    conn.poll(look.request_id)
                    if paused
                    else conn.wait(look.request_id, timeout=QUERY_WAIT)
                )
            except orbitkv.TimedOut:
                reply = None
            except orbitkv.OrbitKVError as e:
                # Refused (a miss), or the connection is gone: asked again on the next one.
                self.lookups.pop(rid, None)
                self._failed(e)
                return 0, False
            if reply is None and paused:
                return 0, False
            if reply is None:
                if now - look.asked < QUERY_DEADLINE:
                    # Not blocking the step: asked again at the next one.
                    return None, False
                # The daemon holds the connection but answers nothing: a miss, recomputed.
                conn.forget(look.request_id)
                look.request_id = None
                look.boundary = origin
                self.unanswered_until = now + UNANSWERED_PAUSE
                self.stats.add("query_timeouts", 1)
                log.warning(
                    "OrbitKV: a Query went unanswered for %.1f s; lookups count as misses for "
                    "%.0f s",
                    QUERY_DEADLINE,
                    UNANSWERED_PAUSE,
                )
                return 0, False
            look.request_id = None
            # A boundary outside what was asked is no proof of it (a hostile or broken peer).
            proven = reply.boundary if isinstance(reply, orbitkv.Proof) else origin
            look.boundary = proven if origin <= proven <= end else origin
        external = max(0, (look.boundary or origin) - origin)
        return external, external > 0

    def after_alloc(
        self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int
    ) -> None:
        """Acquire: one lease pinning the records that prove the boundary vLLM allocated for;
        the loads go to the workers."""
        rid = request.request_id
        block_ids = blocks.get_block_ids()
        # Blocks handed out to a request that waits for a load are in no scheduled request.
        self.handed_out.update(b for ids in block_ids for b in ids if b)
        look = self.lookups.pop(rid, None)
        if look is not None and look.request_id is not None and look.conn is not None:
            # Allocated as a miss while its Query was pending: its reply is not wanted.
            look.conn.forget(look.request_id)
            look = None
        origin = look.origin if look is not None else self.origins.get(rid, 0)
        # The next lookup of this request (after a preemption) asks again.
        self.origins.pop(rid, None)
        if num_external_tokens == 0:
            return
        bs = self.block
        first, stop = origin // bs, (origin + num_external_tokens) // bs
        wanted = range(first, stop)
        live = self._sealed() if look is not None else None
        proof: orbitkv.Proof | None = None
        lease = epoch = 0
        if live is not None and look is not None:
            conn, seal = live
            epoch = seal.epoch
            try:
                # Up to the boundary vLLM allocated for, not the Query's end: a proof reaching
                # further would place a window's or a checkpoint's pages after it.
                a = conn.submit_acquire(
                    seal.token, seal.epoch, origin, stop * bs, self._named(look.hashes[:stop])
                )
                reply = conn.wait(a, timeout=ACQUIRE_WAIT)
                if isinstance(reply, orbitkv.Leased):
                    proof, lease = reply.proof, reply.lease
            except orbitkv.TimedOut:
                self.late.append((conn, a, time.monotonic() + LATE_ACQUIRE_WATCH))
            except orbitkv.OrbitKVError as e:
                self._failed(e)
        if proof is not None and not origin <= proof.boundary <= stop * bs:
            # A boundary outside what was asked is no proof of it.
            proof = None
        proven = (proof.boundary if proof is not None else origin) // bs
        pages: list[tuple[int, int, int, int]] = []
        if proof is not None:
            for pl in proof.loads:
                if pl.group not in self.group_ids or pl.group >= len(block_ids):
                    # A group this instance does not have: its blocks stay unloaded (lost).
                    proven = first
                    pages = []
                    break
                ids = block_ids[pl.group]
                # A window group's blocks before its window are vLLM's null block 0: skipped.
                pages += [
                    (pl.group, b, ids[b], pl.rank) for b in pl.blocks if b in wanted and ids[b]
                ]
        lost = tuple(ids[b] for ids in block_ids for b in wanted if b >= proven and ids[b])
        if proof is None:
            self.stats.add("acquire_failures", 1)
        self.stats.add("lost_blocks", len(lost))
        self.stats.add("hit_tokens", max(0, min(proven, stop) - first) * bs)
        if lease:
            self.leases.add((epoch, lease))
        self.loading[rid] = {ids[b] for ids in block_ids for b in wanted if ids[b]}
        self.loads.append(LoadSpec(rid, lease, tuple(pages), lost, whole=self.whole, epoch=epoch))

    def _release_late(self) -> None:
        """Gives back the leases of Acquires answered after their wait; forgets those that
        stay unanswered past the watch, or whose connection is gone."""
        live = self._sealed()
        still = []
        for conn, request, until in self.late:
            if live is None or live[0] is not conn:
                continue
            try:
                reply = conn.poll(request)
                if isinstance(reply, orbitkv.Leased):
                    conn.forget(conn.submit_release(live[1].token, reply.lease))
                elif reply is None and time.monotonic() < until:
                    still.append((conn, request, until))
                elif reply is None:
                    conn.forget(request)
            except orbitkv.OrbitKVError as e:
                self._failed(e)
                return
        self.late = still

    def build_meta(self, scheduler_output: SchedulerOutput) -> OrbitKVMetadata:
        if self.late:
            self._release_late()
        meta = OrbitKVMetadata(
            loads=self.loads,
            preempted=set(scheduler_output.preempted_req_ids or ()),
            allocated=_allocated(scheduler_output) | self.handed_out,
        )
        self.loads = []
        self.handed_out = set()
        # A preempted request's publishes are copied out before its blocks are freed (the
        # workers wait for them): its blocks wait for nothing more, even if it is aborted
        # while it waits for a load.
        self.publishing -= meta.preempted
        if not self.s.producer or self.stale:
            return meta
        bs = self.block
        computed: dict[str, int] = {
            r.req_id: r.num_computed_tokens for r in scheduler_output.scheduled_new_reqs
        }
        cached = scheduler_output.scheduled_cached_reqs
        for rid, n in zip(cached.req_ids, cached.num_computed_tokens, strict=False):
            computed[rid] = n
        state = scheduler_output.kv_connector_block_state
        # Pages: each attention group's blocks the step fills, by their place in the request.
        positional = [g for g in self.groups if g.kind != "mamba"]
        for rid, scheduled in scheduler_output.num_scheduled_tokens.items():
            request = self._publishable(rid)
            c = computed.get(rid)
            ids = state.get_block_ids(rid) if state is not None else None
            if request is None or c is None or not ids:
                continue
            for i in range(c // bs, min((c + scheduled) // bs, len(request.block_hashes))):
                for g in positional:
                    group = ids[g.group]
                    if i < len(group) and group[i]:
                        self._publish(meta, request, g.group, group[i], i)
        # Mamba states: the exact blocks vLLM offers, each holding the state at a block's end
        # once this step has run (never resolved by place: the worker's table keeps stale ids).
        offers = state.boundary_state_offloads if state is not None else {}
        for rid, entries in offers.items():
            request = self._publishable(rid)
            if request is None:
                continue
            for group, block, boundary in entries:
                i = boundary // bs - 1
                if boundary % bs == 0 and 0 <= i < len(request.block_hashes) and block:
                    self._publish(meta, request, group, block, i)
        return meta

    def _publishable(self, rid: str) -> Request | None:
        request = self.requests.get(rid)
        if request is None or getattr(request, "lora_request", None) is not None:
            return None
        return request

    def _publish(
        self, meta: OrbitKVMetadata, request: Request, group: int, block: int, i: int
    ) -> None:
        """Publishes block `block` of `group` as the record of the request's block `i`."""
        hashes, bs = request.block_hashes, self.block
        meta.publishes.append(
            PublishSpec(
                request=request.request_id,
                group=group,
                block=block,
                hash=bytes(hashes[i]),
                parent=bytes(hashes[i - 1]) if i > 0 else b"",
                start=i * bs,
                end=(i + 1) * bs,
            )
        )
        self.publishing.add(request.request_id)
        self.stats.add("published_blocks", 1)

    def loads_reported(
        self, received: set[str] | None, failed: set[str] | None, invalid: set[int] | None
    ) -> None:
        """The workers' report of a step: the requests whose loads every rank ran, those that
        failed as a whole, and the blocks that failed to load. A request with a failure is
        recomputed (from its first failed block), without asking again."""
        failed = set(failed or ())
        if invalid:
            failed |= {r for r, blocks in self.loading.items() if not blocks.isdisjoint(invalid)}
        for r in received or ():
            self.loading.pop(r, None)
        self.failed |= failed & self.requests.keys()
        self.stats.add("failed_loads", len(failed))

    def weights_changed(self) -> None:
        """A worker's weights changed in place: 0 external tokens, no publishes, until restart."""
        if not self.stale:
            log.warning("OrbitKV: weights changed in place: serving and publishing stop")
        self.stale = True

    def loaded(self, leases: frozenset[tuple[int, int]]) -> None:
        """The workers ran the loads of these (epoch, lease) pairs: they are given back. (With
        async scheduling vLLM schedules the next step before the last one's output comes back,
        so a lease acquired since is not given back with them.) A lease of another epoch ended
        with it."""
        live = self._sealed()
        mine = leases & self.leases
        self.leases -= mine
        if live is None or not mine:
            return
        conn, seal = live
        for epoch, lease in mine:
            if epoch != seal.epoch:
                continue
            try:
                conn.forget(conn.submit_release(seal.token, lease))
            except orbitkv.OrbitKVError as e:
                self._failed(e)
                return

    def finished(self, request: Request) -> tuple[bool, dict[str, Any] | None]:
        """A finished request's blocks stay allocated until its publishes are copied out."""
        rid = request.request_id
        self.requests.pop(rid, None)
        look = self.lookups.pop(rid, None)
        if look is not None and look.request_id is not None and look.conn is not None:
            # Its reply is not wanted any more: the connection keeps no reply for it.
            look.conn.forget(look.request_id)
        self.origins.pop(rid, None)
        delay = rid in self.publishing
        self.publishing.discard(rid)
        self.failed.discard(rid)
        self.loading.pop(rid, None)
        return delay, None

    def _failed(self, e: orbitkv.OrbitKVError) -> None:
        """A request failed: a refusal is a miss, the connection kept, unless it says the
        session is gone (the instance sealed again, or the daemon restarted)."""
        if isinstance(e, orbitkv.RefusedError) and not session_gone(e):
            log.debug("OrbitKV: refused (%s); counted as a miss", e)
            return
        self._lost(e)

    def _lost(self, e: Exception) -> None:
        if self.session is not None:
            self.session.lost(str(e))
        # The daemon ends a connection's leases with it.
        self.leases.clear()
        self.late.clear()
        # Answers already in stay; queries asked on the lost connection are asked again.
        self.lookups = {r: k for r, k in self.lookups.items() if k.boundary is not None}

    def close(self) -> None:
        if self.session is not None:
            self.session.close()


def _allocated(scheduler_output: SchedulerOutput) -> set[int]:
    """The blocks vLLM hands out in this step, every group's."""
    blocks: set[int] = set()
    for new in scheduler_output.scheduled_new_reqs:
        for ids in new.block_ids or ():
            blocks.update(ids)
    for added in scheduler_output.scheduled_cached_reqs.new_block_ids or ():
        for ids in added or ():
            blocks.update(ids)
    blocks.discard(0)
    return blocks
