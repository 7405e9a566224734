"""`OrbitKVStorage`: SGLang's HiCache storage backend (the v1 zero-copy calls) over a daemon.

Every rank registers as a worker of an instance without a scheduler, and registers SGLang's
host pool in place (its shared-memory memfd) with a states-only region fencing each page. Keys
are SGLang's page hashes (hex), in the SGLang hash domain; a page's token position comes from
the hashes SGLang passes before the call's keys (`prefix_keys`).

- `batch_exists` = Query: the leading pages the daemon proves for every rank.
- `batch_get_v1` = Acquire, Load into the given host pages (fresh generations), Release.
- `batch_set_v1` = Publish, returning once the pages are copied out (SGLang reuses them then).
- The v2 calls move a hybrid model's sliding-window pages and Mamba states beside the KV pages;
  a hit is a boundary where every group holds.

No call raises into SGLang's threads: a failure is a miss, or a page not stored. After a reply
that did not come, calls do not ask the daemon for `UNANSWERED_PAUSE` seconds."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import Counter
from typing import TYPE_CHECKING, NamedTuple

from sglang.srt.mem_cache.hicache_storage import HiCacheStorage, PoolTransferResult
from sglang.srt.observability.metrics_collector import StorageMetrics

import orbitkv
from orbitkv import weights
from orbitkv.session import (
    Registration,
    Session,
    chunks,
    session_gone,
    settle,
    take_replies,
)
from orbitkv.sglang.settings import (
    DOMAIN,
    GROUP,
    POOL,
    HostPages,
    check_stage,
    host_pages,
    hybrid_refusal,
    identity,
    settings_from,
    sidecar_pages,
    state_format,
    storage_layout,
    watch_weight_updates,
    weight_version,
)

if TYPE_CHECKING:
    from collections.abc import Iterator

    import torch
    from sglang.srt.mem_cache.hicache_storage import (
        HiCacheStorageConfig,
        HiCacheStorageExtraInfo,
        PoolTransfer,
    )
    from sglang.srt.mem_cache.pool_host.base import HostKVCache

    from orbitkv._native import _LoadPage, _PublishPage

log = logging.getLogger("orbitkv.sglang")


class _Placed(NamedTuple):
    """One key of a pool transfer in one group of its pool."""

    block: int
    group: HostPages
    page: int
    # The transfer's pool name, the key's index, and the groups of the pool.
    owner: tuple[str, int, int]


# How long a call waits for the daemon, at most: a Query, an Acquire, a Load, a PublishCopied.
QUERY_WAIT = 1.0
LOAD_WAIT = 30.0
COPIED_WAIT = 30.0
# How long registration waits for its seal at start-up (it goes on in the background).
SEAL_WAIT = 5.0
# How long a call whose reply never came waits for the daemon to let go of its pages (a
# lease's time to live).
SETTLE_WAIT = 30.0
# How long a pool registration waits for its reply (under the lock every call takes).
POOL_WAIT = 10.0
# After a reply did not come, calls are misses or not stored without asking for this long: a
# daemon that holds its connection open but answers nothing costs one call its wait, not each.
UNANSWERED_PAUSE = 5.0
# How long a late Acquire's reply is watched for, so that a lease granted after all is given
# back at once rather than pinning its records until the daemon's lease TTL.
LATE_ACQUIRE_WATCH = 60.0
# Publishes whose PublishDurable is awaited, at most: past it the oldest is forgotten.
DURABLE_WAIT_MAX = 4096
# Entries each list of `get_stats()` gathers between two calls, at most: the rest are dropped.
METRICS_MAX = 4096
GIB = 1 << 30


class OrbitKVStorage(HiCacheStorage):
    """The HiCache storage backend SGLang loads with `--hicache-storage-backend dynamic`."""

    def __init__(
        self, storage_config: HiCacheStorageConfig, kwargs: dict[str, object] | None = None
    ) -> None:
        self.config = storage_config
        self.s = settings_from(storage_config)
        # Resolved at start-up: a model whose content cannot be read refuses here.
        self.identity = identity(self.s)
        watch_weight_updates()
        # The KV pool's pages; every group's (the KV group, then a hybrid model's others); the
        # groups of each pool beside the KV one, by SGLang's pool name.
        self.pages: HostPages | None = None
        self.groups: list[HostPages] = []
        self.sidecars: dict[str, list[HostPages]] = {}
        # Each pool's states-only region, by pool id.
        self.states: dict[int, orbitkv.HostPool] = {}
        self.session: Session | None = None
        self.pool_ready = False
        self.weights_changed = False
        # Publishes copied out, their PublishDurable not taken yet: (connection, request).
        self.durable_wait: list[tuple[orbitkv.Connection, int]] = []
        # Acquires whose reply came too late: (connection, token, request, watched until).
        self.late: list[tuple[orbitkv.Connection, bytes, int, float]] = []
        # Until when calls do not ask the daemon (a reply did not come).
        self.unanswered_until = 0.0
        # SGLang calls from its backup and prefetch threads at once: the session's state and
        # the lists above are changed under this.
        self._lock = threading.Lock()
        # Queries, hit pages, loaded and published pages, failures (`counters()`).
        self.stats: Counter[str] = Counter()
        # What `get_stats()` hands SGLang, gathered only with its storage metrics on.
        self.metrics_on = bool(getattr(storage_config, "enable_storage_metrics", False))
        self.metrics = StorageMetrics()

    # -- the pools ---------------------------------------------------------------------------

    def register_mem_pool_host(self, mem_pool_host: HostKVCache) -> None:
        """The KV host pool (the anchor); the rank registers once every pool is known."""
        super().register_mem_pool_host(mem_pool_host)
        if self.session is not None:
            self.session.close()
            self.session = None
        self.pages = host_pages(mem_pool_host)
        check_stage(self.s, self.pages)
        self.groups = [self.pages]
        self.sidecars = {}

    def register_mem_host_pool_v2(self, host_pool: HostKVCache, host_pool_name: object) -> None:
        """A hybrid model's host pools: the sliding-window pool and the Mamba pool are mapped
        (`sidecar_pages`); any other is refused at start-up, as is one added later (the
        instance's layout is sealed by then)."""
        name = str(getattr(host_pool_name, "value", host_pool_name))
        if name != "kv" and self.pages is not None:
            if self.session is not None:
                raise hybrid_refusal(
                    name,
                    "was added after the rank registered (draft and late pools are not mapped)",
                )
            self.sidecars[name] = sidecar_pages(name, host_pool, self.s)
            self.groups = [self.pages] + [g for gs in self.sidecars.values() for g in gs]
        super().register_mem_host_pool_v2(host_pool, host_pool_name)

    def on_host_pools_registered(self) -> None:
        """Every host pool is known: registers the rank, its layout holding each pool's groups."""
        if self.pages is None:
            return
        s = self.s
        groups = sorted(self.groups, key=lambda g: g.group)
        self.states = {g.pool: orbitkv.HostPool(g.spec, states_only=True) for g in groups}
        self.session = Session(
            s.socket,
            Registration(
                instance=s.instance,
                role="worker",
                rank=s.rank,
                workers=s.workers,
                identity=self.identity,
                layout=storage_layout(s, groups),
                domain=DOMAIN,
                model=s.model,
                revision=s.revision,
                formats=tuple(state_format(s, g, s.rank).encode() for g in groups),
                rules=tuple((g.group, *g.rule) for g in groups),
                no_scheduler=True,
                client="orbitkv-sglang",
            ),
            on_seal=self._register_pool,
        )
        if self.session.sealed(wait=SEAL_WAIT) is None:
            log.warning("OrbitKV: rank %d not sealed yet; registering in the background", s.rank)

    def _register_pool(self, conn: orbitkv.Connection, seal: orbitkv.Sealed) -> None:
        self.pool_ready = False
        for g in self.groups:
            conn.register_engine_memory_pool(
                seal.token, self.states[g.pool], g.fd, 0, timeout=POOL_WAIT
            )
        self.pool_ready = bool(self.groups)

    def _live(self) -> tuple[orbitkv.Connection, orbitkv.Sealed] | None:
        """The connection and seal to use, or `None` (away, the weights changed, or a reply
        did not come lately)."""
        if self.session is None or self._weights_moved():
            return None
        if self.late:
            self._release_late()
        if time.monotonic() < self.unanswered_until:
            return None
        with self._lock:
            seal = self.session.sealed()
            conn = self.session.conn
        if seal is None or conn is None or not self.pool_ready:
            return None
        return conn, seal

    def _weights_moved(self) -> bool:
        """Weights changed in place since start-up (a scheduler weight update, or a new weight
        version in the runtime context): the identity no longer names the computation, so
        nothing is served or published until a restart."""
        if not self.weights_changed and (
            weights.changed() or weight_version() != self.s.weight_version
        ):
            self.weights_changed = True
            log.error(
                "OrbitKV: the weights changed in place (version %s); serving and publishing "
                "stop until the server restarts with a new identity",
                weight_version(),
            )
        return self.weights_changed

    @property
    def _record_rank(self) -> int:
        """The rank this rank's records are stored under: its own, or MLA's one copy's."""
        if self.pages is not None and self.pages.mla:
            return orbitkv.RANK_REPLICATED
        return self.s.rank

    def _chain(self, keys: list[str], prefix: list[str]) -> list[bytes]:
        """The page hashes from the sequence start: the hashes before `keys`, then `keys`."""
        return [bytes.fromhex(k) for k in [*prefix, *keys]]

    @staticmethod
    def _named(groups: list[int], chain: list[bytes]) -> list[tuple[int, list[bytes]]]:
        """The hashes of each group a Query or an Acquire names: the daemon proves those."""
        return [(g, chain) for g in groups]

    def _ask(
        self, conn: orbitkv.Connection, request: int, timeout: float
    ) -> orbitkv._native._Reply | None:
        """The reply to `request`, or `None` when it has not come within `timeout` (it is
        then forgotten, not left in the connection, and the daemon is not asked for a while)."""
        try:
            return conn.wait(request, timeout=timeout)
        except orbitkv.TimedOut:
            conn.forget(request)
            self._unanswered(timeout)
            return None

    def _unanswered(self, timeout: float) -> None:
        """A reply did not come within `timeout`: calls do not ask for `UNANSWERED_PAUSE`."""
        self.stats["timeouts"] += 1
        with self._lock:
            self.unanswered_until = time.monotonic() + UNANSWERED_PAUSE
        log.warning(
            "OrbitKV: a reply did not come within %.1f s; calls are misses and pages are not "
            "stored for %.0f s",
            timeout,
            UNANSWERED_PAUSE,
        )

    def _release_late(self) -> None:
        """Gives back the leases of Acquires answered after their wait; forgets those that
        stay unanswered past the watch. One on a connection since replaced is dropped: the
        daemon ended its leases with that connection."""
        with self._lock:
            late, self.late = self.late, []
            current = self.session.conn if self.session is not None else None
        still = []
        for conn, token, request, until in late:
            if conn is not current or conn.closed is not None:
                continue
            try:
                reply = conn.poll(request)
                if isinstance(reply, orbitkv.Leased):
                    conn.forget(conn.submit_release(token, reply.lease))
                    self.stats["late_leases_released"] += 1
                elif reply is None and time.monotonic() < until:
                    still.append((conn, token, request, until))
                elif reply is None:
                    conn.forget(request)
            except orbitkv.OrbitKVError as e:
                self._fail("releasing a late lease", e, conn)
        with self._lock:
            self.late = still + self.late

    def _measured(self, prefetch: bool, pages: int, page_bytes: int, started: float) -> None:
        """Notes a call that moved `pages` KV pages since `started` (`time.perf_counter()`) for
        SGLang's storage metrics: its pages and its bandwidth in GiB/s."""
        if not self.metrics_on or pages <= 0:
            return
        seconds = max(time.perf_counter() - started, 1e-9)
        with self._lock:
            m = self.metrics
            counts, rates = (
                (m.prefetch_pgs, m.prefetch_bandwidth)
                if prefetch
                else (m.backup_pgs, m.backup_bandwidth)
            )
            if len(counts) < METRICS_MAX:
                counts.append(pages)
                rates.append(pages * page_bytes / seconds / GIB)

    def _settle(
        self, pages: list[tuple[int, int]], copying_in: orbitkv.Connection | None = None
    ) -> None:
        """Lets go of `pages` (pool, page) after a Load (`copying_in`, its connection) or
        Publish whose reply never came (SGLang reuses host pages as soon as the call
        returns)."""
        for pool in {p for p, _ in pages}:
            pool_pages = [page for p, page in pages if p == pool]
            settle(self.states[pool], pool_pages, SETTLE_WAIT, copying_in)

    def _fail(self, call: str, e: BaseException, conn: orbitkv.Connection | None = None) -> None:
        self.stats["errors"] += 1
        if session_gone(e) and self.session is not None:
            with self._lock:
                self.session.lost(str(e), conn)
        log.warning("OrbitKV: %s failed (%s: %s)", call, type(e).__name__, e)

    # -- SGLang's storage calls ------------------------------------------------------------------

    def batch_exists(
        self, keys: list[str], extra_info: HiCacheStorageExtraInfo | None = None
    ) -> int:
        """The leading KV pages of `keys` the daemon proves (for every rank)."""
        return self._exists(keys, extra_info, [GROUP])

    def _exists(
        self, keys: list[str], extra_info: HiCacheStorageExtraInfo | None, groups: list[int]
    ) -> int:
        """The leading pages of `keys` where the daemon proves every one of `groups`."""
        conn = None
        try:
            live = self._live()
            if live is None or not keys:
                return 0
            conn, seal = live
            # SGLang's hybrid controller passes `None` for a chain that starts at the root.
            prefix = extra_info.prefix_keys if extra_info is not None else None
            chain = self._chain(keys, prefix or [])
            ps, first = self.s.page_size, len(chain) - len(keys)
            # One Query names at most MAX_QUERY_BLOCKS hashes over its groups: a longer chain
            # is asked for its leading part, still a prefix the daemon can prove.
            chain = chain[: orbitkv.MAX_QUERY_BLOCKS // len(groups)]
            if len(chain) <= first:
                return 0
            self.stats["queries"] += 1
            request = conn.submit_query(
                seal.token, seal.epoch, first * ps, len(chain) * ps, self._named(groups, chain)
            )
            reply = self._ask(conn, request, QUERY_WAIT)
            if not isinstance(reply, orbitkv.Proof):
                return 0
            hit = max(0, min(len(keys), reply.boundary // ps - first))
            self.stats["hit_pages"] += hit
            return hit
        except Exception as e:  # never into SGLang's thread
            self._fail("batch_exists", e, conn)
            return 0

    def batch_get_v1(
        self,
        keys: list[str],
        host_indices: torch.Tensor,
        extra_info: HiCacheStorageExtraInfo | None = None,
    ) -> list[bool]:
        """Loads the proven leading pages of `keys` into the host pages `host_indices` names
        (token slots, a page's run each); true per page loaded."""
        done = [False] * len(keys)
        conn, loading = None, []
        started = time.perf_counter()
        try:
            live = self._live()
            prefix = extra_info.prefix_keys if extra_info is not None else None
            # Without the hashes before `keys` their position is unknown: a miss.
            if live is None or self.pages is None or prefix is None:
                return done
            if not keys:
                return done
            conn, seal = live
            chain = self._chain(keys, prefix)
            ps, first = self.s.page_size, len(prefix)
            # The KV pages alone: SGLang loads a hybrid model's other pools afterwards (v2), and
            # a long prefix in batches whose ends need not be any other pool's boundary.
            with self._acquired(conn, seal, first * ps, [GROUP], chain) as leased:
                if leased is None:
                    return done
                slots = host_indices.tolist()
                wanted: list[int] = []
                pages = []
                states = self.states[POOL]
                for load in leased.proof.loads:
                    if load.rank != self._record_rank or load.group != GROUP:
                        continue
                    for block in load.blocks:
                        i = block - first
                        if 0 <= i < len(keys):
                            page = int(slots[i * ps]) // ps
                            generation = states.reuse(page)
                            layers = self.pages.layers
                            pages.append(
                                (block, GROUP, load.rank, POOL, page, generation, 0, layers)
                            )
                            wanted.append(i)
                if pages:
                    loading = [(POOL, p[4]) for p in pages]
                    statuses = self._load(conn, seal, leased, pages)
                    if statuses is not None:
                        loading = []
                        for i, status in zip(wanted, statuses, strict=False):
                            done[i] = status == "ok"
            loaded = sum(done)
            self.stats["loaded_pages"] += loaded
            self.stats["load_failures"] += len(wanted) - loaded
            self._measured(True, loaded, self.pages.page_bytes, started)
            return done
        except Exception as e:  # never into SGLang's thread
            self._fail("batch_get_v1", e, conn)
            return done
        finally:
            self._settle(loading, conn)

    def batch_set_v1(
        self,
        keys: list[str],
        host_indices: torch.Tensor,
        extra_info: HiCacheStorageExtraInfo | None = None,
    ) -> list[bool]:
        """Publishes the host pages `host_indices` names as the pages `keys`; returns once
        they are copied out (true per page stored)."""
        done = [False] * len(keys)
        conn, copying = None, []
        started = time.perf_counter()
        try:
            live = self._live()
            prefix = extra_info.prefix_keys if extra_info is not None else None
            # MLA: one copy for every rank, stored by the storage writer alone. Without the
            # hashes before `keys` their position is unknown: nothing is stored.
            if live is None or not self.states or not keys or not self.s.writer:
                return done
            if prefix is None:
                return done
            conn, seal = live
            chain = self._chain(keys, prefix)
            ps, first = self.s.page_size, len(prefix)
            slots = host_indices.tolist()
            pages = []
            for i in range(len(keys)):
                n = first + i
                page = int(slots[i * ps]) // ps
                generation = self.states[POOL].reuse(page)
                parent = chain[n - 1] if n else b""
                rank = self._record_rank
                pages.append(
                    (GROUP, rank, chain[n], parent, n * ps, (n + 1) * ps, POOL, page, generation)
                )
            copying = [(POOL, p[7]) for p in pages]
            statuses = self._publish(conn, seal, pages)
            if statuses is not None:
                copying, done = [], statuses
            stored = sum(done)
            self.stats["published_pages"] += stored
            self.stats["publish_failures"] += len(keys) - stored
            if self.pages is not None:
                self._measured(False, stored, self.pages.page_bytes, started)
            return done
        except Exception as e:  # never into SGLang's thread
            self._fail("batch_set_v1", e, conn)
            return done
        finally:
            self._settle(copying)

    @contextlib.contextmanager
    def _acquired(
        self,
        conn: orbitkv.Connection,
        seal: orbitkv.Sealed,
        origin: int,
        groups: list[int],
        chain: list[bytes],
    ) -> Iterator[orbitkv.Leased | None]:
        """The lease of what the daemon proves of `groups` from `origin` to the chain's end
        (`None`: nothing, or no reply), released when the block ends."""
        end = len(chain) * self.s.page_size
        request = conn.submit_acquire(
            seal.token, seal.epoch, origin, end, self._named(groups, chain)
        )
        try:
            leased = conn.wait(request, timeout=QUERY_WAIT)
        except orbitkv.TimedOut:
            # Watched, not forgotten: a lease granted after all is given back (`_release_late`).
            with self._lock:
                until = time.monotonic() + LATE_ACQUIRE_WATCH
                self.late.append((conn, seal.token, request, until))
            self._unanswered(QUERY_WAIT)
            leased = None
        if not isinstance(leased, orbitkv.Leased):
            yield None
            return
        try:
            yield leased
        finally:
            conn.forget(conn.submit_release(seal.token, leased.lease))

    def _load(
        self,
        conn: orbitkv.Connection,
        seal: orbitkv.Sealed,
        leased: orbitkv.Leased,
        pages: list[_LoadPage],
    ) -> list[str] | None:
        """Loads `pages` under the lease: each page's status, or `None` when the reply never
        came (the caller then settles the pages)."""
        request = conn.submit_load(seal.token, seal.epoch, leased.lease, pages)
        statuses = self._ask(conn, request, LOAD_WAIT)
        return statuses.statuses if isinstance(statuses, orbitkv.Pages) else None

    def _publish(
        self, conn: orbitkv.Connection, seal: orbitkv.Sealed, pages: list[_PublishPage]
    ) -> list[bool] | None:
        """Publishes `pages` (several Publishes past the daemon's per-request limits); true per
        page copied out, or `None` when a reply never came. Durability is the daemon's own: its
        reply is taken later, never waited for."""
        out: list[bool] = []
        # Sized by a KV page (a hybrid model's other pages are of its order).
        page_bytes = self.pages.page_bytes if self.pages is not None else 0
        for part in chunks([page_bytes] * len(pages)):
            request = conn.submit_publish(seal.token, seal.epoch, [pages[i] for i in part])
            copied = self._ask(conn, request, COPIED_WAIT)
            if not isinstance(copied, orbitkv.Pages):
                return None
            with self._lock:
                self.durable_wait.append((conn, request))
                # A PublishDurable that never comes must not grow the list: the oldest is
                # forgotten.
                dropped = self.durable_wait[:-DURABLE_WAIT_MAX]
                del self.durable_wait[:-DURABLE_WAIT_MAX]
            for c, r in dropped:
                c.forget(r)
            self.stats["durable_unknown"] += len(dropped)
            out += [status == "ok" for status in copied.statuses]
        self.wait_durable(0.0)
        return out

    def wait_durable(self, timeout: float) -> bool:
        """Takes the PublishDurable replies that have come, waiting up to `timeout` for all;
        true when none is left. A page found not durable was never served. Request ids restart
        on a new connection, so a publish of a connection since replaced is forgotten."""
        with self._lock:
            waiting, self.durable_wait = self.durable_wait, []
            conn = self.session.conn if self.session is not None else None
        if conn is None or conn.closed is not None:
            conn = None
        mine = []
        for c, r in waiting:
            if c is conn:
                mine.append(r)
            else:
                c.forget(r)
                self.stats["durable_unknown"] += 1
        if conn is None:
            return True
        still, arrived = take_replies(conn, mine, timeout)
        for reply in arrived.values():
            if isinstance(reply, orbitkv.Pages) and not reply.all_ok:
                # `held`: stored in the daemon's DRAM for SSD admission, readable, not durable.
                self.stats["held_pages"] += sum(st == "held" for st in reply.statuses)
                self.stats["durable_failures"] += sum(
                    st not in ("ok", "held") for st in reply.statuses
                )
        with self._lock:
            self.durable_wait[:0] = [(conn, r) for r in still]
            return not self.durable_wait

    # -- the v2 calls: a hybrid model's pools beside the KV one ---------------------------------
    #
    # SGLang moves the KV pages through the v1 calls, and the sliding-window pages and Mamba
    # states through these. Each pool transfer names the trailing pages of one chain: the
    # hashes before them are `extra_info.prefix_keys`. OrbitKV proves every group at once (the
    # KV prefix, the window, the checkpoint), so a hit is a boundary where all of them hold.

    def _sidecar(self, transfers: list[PoolTransfer]) -> list[tuple[PoolTransfer, list[HostPages]]]:
        """Each transfer with its pool's groups; a pool not registered has none."""
        return [
            (t, self.sidecars.get(str(getattr(t.name, "value", t.name)), [])) for t in transfers
        ]

    def batch_exists_v2(
        self,
        keys: list[str],
        pool_transfers: list[PoolTransfer] | None = None,
        extra_info: HiCacheStorageExtraInfo | None = None,
    ) -> PoolTransferResult:
        """The boundary the daemon proves for every group (`kv_hit_pages`), which is then the
        one restorable prefix length; each pool asked about reports the same boundary."""
        try:
            sidecars = self._sidecar(pool_transfers or [])
            if any(not groups for _, groups in sidecars):
                return PoolTransferResult.empty()
            named = [GROUP] + [g.group for _, groups in sidecars for g in groups]
            hit = self._exists(keys, extra_info, named)
            if hit == 0:
                return PoolTransferResult(0, {}, [])
            pools = {"kv": hit} | {
                str(getattr(t.name, "value", t.name)): hit for t in pool_transfers or []
            }
            return PoolTransferResult(hit, pools, [hit])
        except Exception as e:  # never into SGLang's thread
            self._fail("batch_exists_v2", e)
            return PoolTransferResult.empty()

    def batch_get_v2(
        self, transfers: list[PoolTransfer], extra_info: HiCacheStorageExtraInfo | None = None
    ) -> dict[str, list[bool]]:
        """Loads each transfer's trailing pages (a window's pages, a Mamba checkpoint) into its
        host pool, when the daemon proves every group at the chain's end; true per key loaded
        (for a Mamba state: every buffer of it)."""
        done = {str(t.name): [False] * len(t.keys or []) for t in transfers}
        conn, loading = None, []
        try:
            live = self._live()
            prefix = extra_info.prefix_keys if extra_info is not None else None
            sidecars = self._sidecar(transfers)
            keys = max((list(t.keys or []) for t in transfers), key=len, default=[])
            if live is None or prefix is None or not keys or any(not g for _, g in sidecars):
                return done
            conn, seal = live
            chain = self._chain(keys, prefix)
            ps, first = self.s.page_size, len(prefix)
            named = [g.group for _, groups in sidecars for g in groups]
            with self._acquired(conn, seal, first * ps, named, chain) as leased:
                # Only the boundary at the chain's end is the one SGLang restores to.
                if leased is None or leased.proof.boundary != len(chain) * ps:
                    return done
                proven = {
                    (load.group, block)
                    for load in leased.proof.loads
                    if load.rank == self.s.rank
                    for block in load.blocks
                }
                pages, owners = [], []
                for p in self._placed(sidecars, len(chain)):
                    if (p.group.group, p.block) not in proven:
                        continue
                    g = p.group
                    generation = self.states[g.pool].reuse(p.page)
                    pages.append(
                        (p.block, g.group, self.s.rank, g.pool, p.page, generation, 0, g.layers)
                    )
                    owners.append(p.owner)
                if pages:
                    loading = [(p[3], p[4]) for p in pages]
                    statuses = self._load(conn, seal, leased, pages)
                    if statuses is not None:
                        loading = []
                        self._count(done, owners, statuses)
            self.stats["loaded_sidecar_pages"] += sum(sum(v) for v in done.values())
            return done
        except Exception as e:  # never into SGLang's thread
            self._fail("batch_get_v2", e, conn)
            return done
        finally:
            self._settle(loading, conn)

    def batch_set_v2(
        self, transfers: list[PoolTransfer], extra_info: HiCacheStorageExtraInfo | None = None
    ) -> dict[str, list[bool]]:
        """Publishes each transfer's trailing pages: a window's pages, or a Mamba state as the
        checkpoint at the chain's end (one record per buffer); true per key copied out."""
        done = {str(t.name): [False] * len(t.keys or []) for t in transfers}
        conn, copying = None, []
        try:
            live = self._live()
            prefix = extra_info.prefix_keys if extra_info is not None else None
            sidecars = self._sidecar(transfers)
            if live is None or prefix is None or not self.s.writer:
                return done
            conn, seal = live
            ps = self.s.page_size
            chain = self._chain(max((list(t.keys or []) for t in transfers), key=len), prefix)
            pages, owners = [], []
            for p in self._placed(sidecars, len(chain)):
                n, g = p.block, p.group
                generation = self.states[g.pool].reuse(p.page)
                parent = chain[n - 1] if n else b""
                start, end = n * ps, (n + 1) * ps
                pages.append(
                    (g.group, self.s.rank, chain[n], parent, start, end, g.pool, p.page, generation)
                )
                owners.append(p.owner)
            if not pages:
                return done
            copying = [(p[6], p[7]) for p in pages]
            statuses = self._publish(conn, seal, pages)
            if statuses is not None:
                copying = []
                self._count(done, owners, ["ok" if ok else "failed" for ok in statuses])
            self.stats["published_sidecar_pages"] += sum(sum(v) for v in done.values())
            return done
        except Exception as e:  # never into SGLang's thread
            self._fail("batch_set_v2", e, conn)
            return done
        finally:
            self._settle(copying)

    @staticmethod
    def _placed(
        sidecars: list[tuple[PoolTransfer, list[HostPages]]], end: int
    ) -> Iterator[_Placed]:
        """Each key of each transfer (its trailing keys end at block `end`) in each group of its
        pool, with its host page; a group whose host indices do not match the keys is left out
        (its keys are then never done)."""
        for transfer, groups in sidecars:
            keys = list(transfer.keys or [])
            first = end - len(keys)
            slots = transfer.host_indices.tolist() if transfer.host_indices is not None else []
            for g in groups:
                if len(slots) != len(keys) * g.slots_per_page:
                    continue
                for i in range(len(keys)):
                    page = int(slots[i * g.slots_per_page]) // g.slots_per_page
                    yield _Placed(first + i, g, page, (str(transfer.name), i, len(groups)))

    @staticmethod
    def _count(
        done: dict[str, list[bool]], owners: list[tuple[str, int, int]], statuses: list[str]
    ) -> None:
        """Marks a transfer's key done when every group of its pool was ok for it."""
        ok: Counter[tuple[str, int]] = Counter()
        for (name, i, _), status in zip(owners, statuses, strict=False):
            ok[(name, i)] += status == "ok"
        for name, i, groups in owners:
            done[name][i] = ok[(name, i)] == groups

    # -- the calls before v1: not served (start-up requires `interface_v1`) ---------------------

    def get(
        self, key: str, target_location: object = None, target_sizes: object = None
    ) -> torch.Tensor | None:
        return None

    def batch_get(
        self, keys: list[str], target_locations: object = None, target_sizes: object = None
    ) -> list[torch.Tensor | None] | int:
        return [None] * len(keys)

    def set(
        self,
        key: str,
        value: object = None,
        target_location: object = None,
        target_sizes: object = None,
    ) -> bool:
        return False

    def batch_set(
        self,
        keys: list[str],
        values: object = None,
        target_locations: object = None,
        target_sizes: object = None,
    ) -> bool:
        return False

    def exists(self, key: str) -> bool:
        """A key alone has no token position: never proven."""
        return False

    def get_stats(self) -> StorageMetrics:
        """SGLang's storage metrics since the last call (`--enable-hicache-storage-metrics`):
        the KV pages of each `batch_get_v1` and `batch_set_v1` that moved any, and its
        bandwidth in GiB/s. Empty with the metrics off."""
        with self._lock:
            metrics, self.metrics = self.metrics, StorageMetrics()
        return metrics

    def counters(self) -> dict[str, int]:
        """The backend's own counts: queries, hit pages, pages moved, failures, timeouts."""
        return dict(self.stats)

    def close(self) -> None:
        if self.session is not None:
            self.session.close()
