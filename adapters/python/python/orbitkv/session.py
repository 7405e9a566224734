"""One rank's registration with the daemon, never blocking the engine: the register is
submitted, its seal polled, and a lost daemon reconnected to after a back-off. The engine
adapters (`orbitkv.vllm`, `orbitkv.sglang`) hold one per rank, and take their replies and let
go of their pages with the functions below."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import orbitkv

if TYPE_CHECKING:
    from orbitkv._native import _Reply

log = logging.getLogger("orbitkv")

# Seconds between attempts to reach a daemon that is away, at most.
RETRY_MAX = 5.0
# How long the first attempt waits for the daemon's handshake, and how long later ones wait:
# briefly, since an adapter may hold a lock meanwhile and a restarting daemon may accept
# before it answers.
HANDSHAKE_WAIT = 10.0
RECONNECT_HANDSHAKE = 1.0
# How often `settle` says that it still waits for a stuck copy into a page.
STUCK_LOG_EVERY = 30.0
# Refusals saying the session itself is gone (the instance sealed again, or the daemon
# restarted): the rank registers again. Any other refusal leaves the connection as it is.
SESSION_GONE = frozenset({"bad_token", "stale_epoch"})


def session_gone(e: BaseException) -> bool:
    """Whether `e` ends the session: the connection is lost, or a refusal says the session is
    gone."""
    if isinstance(e, orbitkv.ConnectionLost):
        return True
    return isinstance(e, orbitkv.RefusedError) and getattr(e, "code", None) in SESSION_GONE


@dataclass(frozen=True)
class Registration:
    """What this rank registers: the same for every rank of the instance but `role`, `rank` and
    `formats`."""

    instance: str
    role: Literal["scheduler", "worker"]
    rank: int
    workers: int
    identity: orbitkv.Identity
    layout: orbitkv.StorageLayout
    domain: str
    model: str
    revision: str | None
    formats: tuple[bytes, ...] = ()
    # One (group, rule, parameter) per group; none: every group is a prefix.
    rules: tuple[tuple[int, str, int], ...] = ()
    # An instance whose ranks are all workers (SGLang).
    no_scheduler: bool = False
    # The client name the daemon logs.
    client: str = "orbitkv-python"


class Session:
    """A connection and its seal. `sealed()` is the seal once it has come, else `None`; it
    submits, polls and reconnects as needed, and waits only as long as it is told."""

    def __init__(
        self,
        socket: str | None,
        registration: Registration,
        on_seal: Callable[[orbitkv.Connection, orbitkv.Sealed], None] | None = None,
    ) -> None:
        self.socket = socket
        self.registration = registration
        self.conn: orbitkv.Connection | None = None
        self.seal: orbitkv.Sealed | None = None
        self._pending: int | None = None
        self._retry_at = 0.0
        self._backoff = 0.1
        self._on_seal = on_seal
        # Whether a connection was attempted already (later attempts wait briefly).
        self._attempted = False
        # Why the last attempt failed, logged once until the reason changes or a seal comes.
        self._failing: str | None = None

    def sealed(self, wait: float = 0.0) -> orbitkv.Sealed | None:
        if self.seal is not None and self.conn is not None and self.conn.closed is None:
            return self.seal
        if self.conn is not None and self.conn.closed is not None:
            self.lost(f"connection closed: {self.conn.closed}")
        if time.monotonic() < self._retry_at:
            return None
        try:
            if self.conn is None:
                wait_hello = RECONNECT_HANDSHAKE if self._attempted else HANDSHAKE_WAIT
                self._attempted = True
                self.conn = orbitkv.Connection(
                    self.socket, client=self.registration.client, handshake_timeout=wait_hello
                )
            if self._pending is None:
                r = self.registration
                self._pending = self.conn.submit_register(
                    instance=r.instance,
                    role=r.role,
                    rank=r.rank,
                    workers=r.workers,
                    identity=r.identity.digest,
                    layout=r.layout.encode(),
                    domain=r.domain,
                    rules=list(r.rules) or [(g, "prefix", 0) for g in r.layout.groups],
                    formats=list(r.formats),
                    model=r.model,
                    revision=r.revision or "",
                    scope=r.identity.scope or "",
                    no_scheduler=r.no_scheduler,
                )
            try:
                reply = (
                    self.conn.wait(self._pending, timeout=wait)
                    if wait > 0
                    else self.conn.poll(self._pending)
                )
            except orbitkv.TimedOut:
                reply = None
            if reply is None:
                return None
            self._pending = None
            if not isinstance(reply, orbitkv.Sealed):
                raise orbitkv.ProtocolViolation(f"register answered {reply!r}")
            self.seal = reply
            self._backoff = 0.1
            self._failing = None
            log.info(
                "OrbitKV: %s rank %d of %s sealed (epoch %d)",
                self.registration.role,
                self.registration.rank,
                self.registration.instance,
                reply.epoch,
            )
            if self._on_seal is not None:
                self._on_seal(self.conn, reply)
            return reply
        except orbitkv.OrbitKVError as e:
            self.lost(str(e))
            return None

    def lost(self, why: str, conn: orbitkv.Connection | None = None) -> None:
        """Drops the connection (only if it is still `conn`, when given: another thread may
        have reconnected since); the next `sealed()` after the back-off registers again."""
        if conn is not None and conn is not self.conn:
            return
        if self.seal is not None:
            log.warning("OrbitKV: daemon connection lost (%s); registering again", why)
        elif why != self._failing:
            # The daemon could not be reached or refused this rank: requests are recomputed
            # meanwhile, and the reason is worth an operator's eye once.
            log.warning(
                "OrbitKV: cannot register with the daemon (%s); trying again every %.0f s at "
                "most, every request recomputed meanwhile",
                why,
                RETRY_MAX,
            )
        self._failing = why
        if self.conn is not None:
            self.conn.close()
        self.conn, self.seal, self._pending = None, None, None
        self._retry_at = time.monotonic() + self._backoff
        self._backoff = min(self._backoff * 2, RETRY_MAX)

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
        self.conn, self.seal = None, None


# A Publish carries at most this many page bytes and pages, within the daemon's default limits
# (1 GiB of page bytes a request, a 16 MiB frame, a connection's memory): larger ones are sent
# as several.
PUBLISH_CHUNK_BYTES = 256 << 20
PUBLISH_CHUNK_PAGES = 4096


def chunks(sizes: list[int]) -> list[range]:
    """`sizes` (each page's bytes) cut into runs of at most `PUBLISH_CHUNK_PAGES` pages and
    `PUBLISH_CHUNK_BYTES` bytes (a larger page alone)."""
    out: list[range] = []
    start, total = 0, 0
    for i, size in enumerate(sizes):
        if i > start and (i - start >= PUBLISH_CHUNK_PAGES or total + size > PUBLISH_CHUNK_BYTES):
            out.append(range(start, i))
            start, total = i, 0
        total += size
    if start < len(sizes):
        out.append(range(start, len(sizes)))
    return out


def take_replies(
    conn: orbitkv.Connection, requests: list[int], timeout: float
) -> tuple[list[int], dict[int, _Reply]]:
    """(the requests whose next reply has not come within `timeout`, the others' replies). A
    request the connection failed on is in neither."""
    deadline = time.monotonic() + timeout
    still: list[int] = []
    arrived: dict[int, _Reply] = {}
    for request in requests:
        left = deadline - time.monotonic()
        try:
            reply = conn.wait(request, left) if left > 0 else conn.poll(request)
        except orbitkv.TimedOut:
            reply = None
        except orbitkv.OrbitKVError:
            continue
        if reply is None:
            still.append(request)
        else:
            arrived[request] = reply
    return still, arrived


def settle(
    pool: orbitkv.HostPool,
    pages: list[int],
    timeout: float,
    copying_in: orbitkv.Connection | None = None,
    *,
    via: orbitkv.Connection | None = None,
) -> None:
    """After a Load or Publish whose reply will not come: waits (up to `timeout`) until the
    daemon holds none of `pages` and moves each to a new generation, so no late copy of the
    daemon's lands in a page the engine reuses (a leased page refuses the move). A page still
    leased at the deadline is revoked: moved to a new generation all the same, so a copy out
    of it still running is discarded by the daemon. A copy into a page cannot be discarded: for
    a Load (`copying_in`, the connection it went on) a page is waited for past the deadline
    while the daemon's process is stopped (a signal, a debugger: it may resume mid-copy). A
    running daemon does not take that long over a copy (no lease spans its reads), and a gone
    one copies nothing: then, or where its process cannot be told, the page is revoked. A
    daemon known gone (`copying_in`, or `via`: the connection a copy out went on) is not
    waited for: its leases never end."""
    conn = copying_in if copying_in is not None else via
    if conn is not None and conn.daemon_state() == "gone":
        timeout = 0.0
    deadline = time.monotonic() + timeout
    revoked: list[int] = []
    for page in pages:
        told = 0.0
        while True:
            try:
                pool.reuse(page)
                break
            except orbitkv.OrbitKVError:
                now = time.monotonic()
                if now > deadline:
                    if copying_in is not None and copying_in.daemon_state() == "stopped":
                        if now - told >= STUCK_LOG_EVERY:
                            told = now
                            log.error(
                                "OrbitKV: page %d stays leased by the daemon (pid %s), which is "
                                "stopped (a signal, a debugger); waiting, so that no late copy "
                                "lands in a reused page",
                                page,
                                copying_in.daemon_pid,
                            )
                        time.sleep(0.05)
                        continue
                    try:
                        pool.revoke(page)
                        revoked.append(page)
                    except orbitkv.OrbitKVError as e:
                        log.error("OrbitKV: page %d cannot be revoked (%s)", page, e)
                    break
                time.sleep(0.005)
    if revoked:
        log.error(
            "OrbitKV: %d page(s) stayed leased by the daemon past %.0f s and were revoked "
            "(first %s)%s",
            len(revoked),
            timeout,
            revoked[:16],
            "; a copy into them may still land"
            if copying_in is not None and copying_in.daemon_state() is None
            else "",
        )
