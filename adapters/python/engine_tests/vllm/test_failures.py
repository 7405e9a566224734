"""Failures never fail a request: a daemon lost between Query and Acquire, or during a Load,
shows as load errors of the request's asynchronous load, and vLLM's real scheduler recomputes
those blocks before it computes anything over them (so nothing computed over a failed load is
published), without asking the daemon again. A daemon that stops answering delays one request
by the Query deadline, not every request for good; a lease it grants after the Acquire's wait
is given back at once; a publish it never copies is revoked. A restarted daemon is registered
with again in the background and serves the records it kept."""

from __future__ import annotations

import dataclasses
import os
import re
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import orbitkv
import orbitkv.vllm.scheduler
import orbitkv.vllm.worker
import pytest
from daemon import Daemon
from harness import BLOCK, Instance
from orbitkv.vllm.metadata import OrbitKVMetadata
from vllm.v1.core.kv_cache_manager import KVCacheBlocks
from vllm.v1.request import Request


@pytest.fixture
def own_daemon(tmp_path: Path) -> Iterator[Daemon]:
    d = Daemon(tmp_path)
    yield d
    d.stop()


def prompt(k: int) -> list[int]:
    return [(i * 29 + 5 + k * 101) % 1000 for i in range(4 * BLOCK)] + [2]


def publish(model: Path, socket: str, prompts: int = 1, first: int = 0) -> None:
    """Publishes prompts `first`, `first + 1`, ... (`prompts` of them)."""
    p = Instance(model, "producer", socket)
    try:
        for k in range(first, first + prompts):
            p.request(f"w{k}", prompt(k))
        p.run()
        assert p.worker.worker.wait_durable(10.0)
    finally:
        p.close()


def kill(d: Daemon) -> None:
    d.proc.kill()
    d.proc.wait()


def run_through(c: Instance, rid: str, k: int = 0) -> tuple[int, Request]:
    """Runs `rid` (prompt `k`) to the end; (tokens it started from, the request)."""
    start, r = c.scheduled(rid, prompt(k))
    assert r.is_finished(), "the request finished"
    return start, r


def test_a_daemon_lost_between_query_and_acquire(own_daemon: Daemon, model_dir: Path) -> None:
    publish(model_dir, own_daemon.socket)
    c = Instance(model_dir, "consumer", own_daemon.socket)
    side = c.connector.scheduler
    real = side.after_alloc

    def after_alloc(request: Request, blocks: KVCacheBlocks, n: int) -> None:
        if n:
            kill(own_daemon)
        real(request, blocks, n)

    side.after_alloc = after_alloc  # type: ignore[method-assign]
    try:
        start, r = run_through(c, "r")
        assert side.stats["queries"] == 1, "asked once"
        assert start == 0, "the four blocks the Query proved are recomputed"
        assert side.stats["lost_blocks"] == 4, "the failed Acquire lost them all"
        assert r.num_output_tokens == 2, "recomputed, then decoded as usual"
    finally:
        c.close()


def test_a_record_evicted_between_query_and_acquire(tmp_path: Path, model_dir: Path) -> None:
    """Between the consumer's Query and its Acquire, other publishes fill a small store: the
    proven records are reclaimed (FIFO), the Acquire proves none of them, and vLLM recomputes."""
    small = Daemon(tmp_path, dram_bytes="64KiB", ssd_bytes="1MiB", policy="fifo")
    try:
        publish(model_dir, small.socket)
        c = Instance(model_dir, "consumer", small.socket)
        side = c.connector.scheduler
        real = side.after_alloc

        def after_alloc(request: Request, blocks: KVCacheBlocks, n: int) -> None:
            if n:
                # 160 records of 8 KiB: past the 1 MiB tier.
                publish(model_dir, small.socket, prompts=40, first=1)
            real(request, blocks, n)

        side.after_alloc = after_alloc  # type: ignore[method-assign]
        try:
            start, r = run_through(c, "r")
            assert side.stats["queries"] == 1, "asked once"
            assert start == 0, "the four blocks the Query proved are recomputed"
            assert side.stats["lost_blocks"] == 4, "the Acquire proved none of them"
            assert c.worker.worker.stats["loaded_bytes"] == 0, "nothing loaded"
            assert r.num_output_tokens == 2, "recomputed, then decoded as usual"
        finally:
            c.close()
    finally:
        small.stop()


def test_a_daemon_lost_during_the_load(own_daemon: Daemon, model_dir: Path) -> None:
    publish(model_dir, own_daemon.socket)
    c = Instance(model_dir, "consumer", own_daemon.socket)
    worker = c.worker.worker
    real = worker.load

    def load(meta: OrbitKVMetadata) -> None:
        if meta.loads:
            kill(own_daemon)
        real(meta)

    worker.load = load  # type: ignore[method-assign]
    try:
        start, r = run_through(c, "r")
        assert start == 0, "recomputed from the first block"
        assert worker.stats["load_failures"] == 4
        assert r.num_output_tokens == 2
    finally:
        c.close()


def test_a_restarted_daemon_is_registered_with_again(own_daemon: Daemon, model_dir: Path) -> None:
    publish(model_dir, own_daemon.socket, prompts=8)
    c = Instance(model_dir, "consumer", own_daemon.socket)
    hits = c.connector.scheduler.stats
    try:
        assert run_through(c, "before", 0)[0] == 4 * BLOCK
        kill(own_daemon)
        # Away: 0 external tokens, and nothing blocks.
        assert run_through(c, "away", 1)[0] == 0
        restarted = Daemon(own_daemon.root)
        own_daemon.proc = restarted.proc
        # Each attempt a prompt the consumer never computed: only the daemon can serve it.
        served = False
        for k in range(2, 8):
            before = hits["hit_tokens"]
            start = run_through(c, f"after-{k}", k)[0]
            if start == 4 * BLOCK and hits["hit_tokens"] - before == 4 * BLOCK:
                served = True
                break
            time.sleep(0.5)
        assert served, "the records kept across the restart are served again"
    finally:
        c.close()


def test_a_stale_generation_is_a_load_error(own_daemon: Daemon, model_dir: Path) -> None:
    """A Load naming a page whose generation moved on (the page was reused meanwhile) is
    refused for that page by the daemon's fence: a load error, and vLLM recomputes."""
    publish(model_dir, own_daemon.socket)
    c = Instance(model_dir, "consumer", own_daemon.socket)
    worker = c.worker.worker
    real = worker._fresh

    def fresh(block: int) -> int | None:
        generation = real(block)
        assert worker.pool is not None
        worker.pool.reuse(block)  # the page moves on before the daemon copies into it
        return generation

    worker._fresh = fresh  # type: ignore[method-assign]
    real_save = worker.save
    published = 0

    def save(meta: OrbitKVMetadata) -> None:
        # What a step publishes was computed over the blocks before it: they hold what the
        # forward pass wrote, never what a failed load left.
        nonlocal published
        for p in meta.publishes:
            if p.request == "r":
                r = c.scheduler.requests["r"]
                blocks = c.scheduler.kv_cache_manager.get_block_ids("r")[0]
                for i in range(p.start // BLOCK):
                    assert c.page(blocks[i]) == c.expected(bytes(r.block_hashes[i]))
                published += 1
        real_save(meta)

    worker.save = save  # type: ignore[method-assign]
    # Two blocks past the four published: the step after the load computes and publishes them.
    longer = prompt(0)[:-1] + [(i * 7 + 3) % 1000 for i in range(2 * BLOCK)] + [2]
    try:
        start, r = c.scheduled("r", longer)
        assert published == 6
        assert start == 0, "recomputed from the first block"
        assert c.connector.scheduler.stats["queries"] == 1, "asked once"
        assert worker.stats["load_failures"] == 4
        assert sum(v for k, v in worker.stats.total.items() if k.startswith("load_")) > 4
        assert r.num_output_tokens == 2
    finally:
        c.close()


def test_a_daemon_that_stops_answering_delays_one_request(
    own_daemon: Daemon, model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    publish(model_dir, own_daemon.socket, prompts=3)
    monkeypatch.setattr(orbitkv.vllm.scheduler, "UNANSWERED_PAUSE", 1.0)
    c = Instance(model_dir, "consumer", own_daemon.socket)
    stats = c.connector.scheduler.stats
    pid = own_daemon.proc.pid
    os.kill(pid, signal.SIGSTOP)
    try:
        # The connection stays open and nothing is answered: the request waits for its Query
        # up to the deadline, then is scheduled as a miss.
        t0 = time.monotonic()
        start, _ = c.first_step("hung", prompt(0))
        waited = time.monotonic() - t0
        assert start == 0
        assert orbitkv.vllm.scheduler.QUERY_DEADLINE <= waited < 5.0, waited
        assert stats["query_timeouts"] == 1
        # The next request does not wait at all while the daemon is known to be silent.
        t0 = time.monotonic()
        start, _ = c.first_step("next", prompt(1))
        assert start == 0
        assert time.monotonic() - t0 < 0.5
    finally:
        os.kill(pid, signal.SIGCONT)
    try:
        time.sleep(1.1)
        start, _ = c.first_step("served", prompt(2))
        assert start == 4 * BLOCK, "answered again once the daemon is back"
        c.run()
    finally:
        c.close()


def test_a_lease_granted_after_its_wait_is_given_back(
    own_daemon: Daemon, model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    publish(model_dir, own_daemon.socket)
    monkeypatch.setattr(orbitkv.vllm.scheduler, "ACQUIRE_WAIT", 0.3)
    c = Instance(model_dir, "consumer", own_daemon.socket)
    side = c.connector.scheduler
    real = side.after_alloc
    pid = own_daemon.proc.pid

    def after_alloc(request: Request, blocks: KVCacheBlocks, n: int) -> None:
        if n:
            # The daemon stalls past the Acquire's wait, then grants the lease after all.
            os.kill(pid, signal.SIGSTOP)
            threading.Timer(1.0, os.kill, (pid, signal.SIGCONT)).start()
        real(request, blocks, n)

    side.after_alloc = after_alloc  # type: ignore[method-assign]

    def leases() -> int:
        assert side.session is not None and side.session.conn is not None
        found = re.search(r"^orbitkv_leases (\d+)$", side.session.conn.stats(), re.M)
        assert found is not None
        return int(found.group(1))

    try:
        start, r = run_through(c, "r")
        assert start == 0, "the four blocks the Query proved are recomputed"
        assert side.stats["acquire_failures"] == 1
        assert r.num_output_tokens == 2, "recomputed, then decoded as usual"
        time.sleep(1.2)
        deadline = time.monotonic() + 5.0
        while leases() and time.monotonic() < deadline:
            c.step()
            time.sleep(0.05)
        assert leases() == 0, "the late lease was given back, not left to its TTL"
        assert not side.late
    finally:
        c.close()


def test_a_lease_of_an_earlier_epoch_is_not_loaded_from(
    own_daemon: Daemon, model_dir: Path
) -> None:
    """A Load goes under the epoch its lease was acquired in: once the instance sealed again
    (a daemon restart numbers leases from 1 again), the lease may name another request's
    records, so its pages fail without a Load being sent."""
    publish(model_dir, own_daemon.socket)
    c = Instance(model_dir, "consumer", own_daemon.socket)
    worker = c.worker.worker
    real = worker.load

    def load(meta: OrbitKVMetadata) -> None:
        meta.loads = [dataclasses.replace(s, epoch=s.epoch - 1) for s in meta.loads]
        real(meta)

    worker.load = load  # type: ignore[method-assign]
    try:
        start, r = run_through(c, "r")
        assert start == 0, "recomputed"
        assert worker.stats["load_failures"] == 4
        assert worker.stats["loaded_bytes"] == 0
        assert r.num_output_tokens == 2
    finally:
        c.close()


def test_a_publish_the_daemon_never_copies_is_revoked_and_its_blocks_freed(
    own_daemon: Daemon, model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A daemon that holds the connection but copies nothing (stopped) keeps no finished
    request's blocks past the copy wait: its pages are revoked, so the copy it makes once it
    runs again is discarded rather than stored from blocks vLLM reused."""
    monkeypatch.setattr(orbitkv.vllm.worker, "COPIED_WAIT", 0.5)
    p = Instance(model_dir, "producer", own_daemon.socket)
    worker = p.worker.worker
    real = worker._submit

    def submit(pages: list[orbitkv.vllm.worker.PublishPage], requests: set[str]) -> None:
        own_daemon.pause()
        real(pages, requests)

    worker._submit = submit  # type: ignore[method-assign]
    try:
        t0 = time.monotonic()
        p.request("w", prompt(0))
        p.run(seconds=10.0)
        assert time.monotonic() - t0 < 5.0, "blocks freed after the copy wait"
        assert "w" in p.freed
        assert worker.stats["publish_failures"] == 4
    finally:
        own_daemon.resume()
        p.close()
    c = Instance(model_dir, "consumer", own_daemon.socket)
    try:
        assert run_through(c, "r")[0] == 0, "the late copy was discarded, not stored"
    finally:
        c.close()


class RefusingAcquires:
    """A connection whose Acquires the daemon refuses (`retry_later`); all else passes."""

    def __init__(self, conn: orbitkv.Connection) -> None:
        self.conn = conn

    def submit_acquire(self, *args: object) -> int:
        e = orbitkv.RefusedError("retry later: a proven record left the store")
        e.code = "retry_later"
        raise e

    def __getattr__(self, name: str) -> object:
        return getattr(self.conn, name)


def test_a_refused_acquire_is_a_miss_and_keeps_the_connection(
    own_daemon: Daemon, model_dir: Path
) -> None:
    """A refusal is a miss: the connection and the instance's seal stay, and the next request
    is served (dropping the connection would leave the scheduler registering alone, in a round
    the sealed workers never join)."""
    publish(model_dir, own_daemon.socket, prompts=2)
    c = Instance(model_dir, "consumer", own_daemon.socket)
    side = c.connector.scheduler
    assert side.session is not None
    conn = side.session.conn
    real = side._sealed
    refusing = True

    def sealed() -> tuple[orbitkv.Connection, orbitkv.Sealed] | None:
        live = real()
        if live is None or not refusing:
            return live
        return RefusingAcquires(live[0]), live[1]  # type: ignore[return-value]

    side._sealed = sealed  # type: ignore[method-assign]
    try:
        start, r = run_through(c, "refused", 0)
        assert start == 0 and side.stats["acquire_failures"] == 1
        assert r.num_output_tokens == 2
        refusing = False
        assert side.session.conn is conn, "the connection stays"
        assert run_through(c, "served", 1)[0] == 4 * BLOCK
    finally:
        c.close()


def test_a_rank_that_reconnects_alone_serves_again(own_daemon: Daemon, model_dir: Path) -> None:
    """One rank's connection drops (a Load timed out, say) while the others stay sealed: it
    registers again alone and the daemon seals it into the instance's current epoch, so the
    instance serves again rather than waiting for a round the other ranks never join."""
    publish(model_dir, own_daemon.socket, prompts=6)
    c = Instance(model_dir, "consumer", own_daemon.socket)
    worker = c.worker.worker
    try:
        assert run_through(c, "before", 0)[0] == 4 * BLOCK
        sealed = worker.session.seal
        assert sealed is not None
        worker.session.lost("a test drops this rank's connection")
        served = False
        for k in range(1, 6):
            if run_through(c, f"after-{k}", k)[0] == 4 * BLOCK:
                served = True
                break
            time.sleep(0.2)
        assert served, "served again"
        again = worker.session.seal
        assert again is not None and again.epoch == sealed.epoch, "the same epoch"
        assert again.token != sealed.token
    finally:
        c.close()


class LeasedPool:
    """A pool whose every page stays leased by the daemon: reuse is refused, revoke moves on."""

    def __init__(self) -> None:
        self.revoked: list[int] = []

    def reuse(self, block: int) -> int:
        raise orbitkv.RefusedError(f"page {block} is leased")

    def revoke(self, block: int) -> int:
        self.revoked.append(block)
        return 7

    def leases(self, block: int) -> int:
        return 1


class DaemonIn:
    """A connection whose daemon's process is in `state`."""

    def __init__(self, state: str | None) -> None:
        self.state = state

    def daemon_state(self) -> str | None:
        return self.state


def test_a_page_a_lost_load_may_still_copy_into_is_skipped_not_revoked(
    own_daemon: Daemon, model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A page still leased after a Load whose reply never came may yet receive that copy: it is
    skipped (its block a load error, or not published) while the daemon may run, and taken
    again, revoked, once the daemon is gone. A page leased by no copy of this rank's is
    revoked at once."""
    c = Instance(model_dir, "consumer", own_daemon.socket)
    worker = c.worker.worker
    pool = LeasedPool()
    monkeypatch.setattr(type(worker), "pool", property(lambda self: pool))
    try:
        daemon = DaemonIn(None)
        worker.abandoned[3] = daemon  # type: ignore[assignment]
        assert worker._fresh(3) is None, "skipped while the daemon may copy"
        daemon.state = "running"
        assert worker._fresh(3) is None
        assert pool.revoked == []
        daemon.state = "gone"
        assert worker._fresh(3) == 7, "revoked once the daemon is gone"
        assert 3 not in worker.abandoned
        assert worker._fresh(5) == 7, "leased by no copy of this rank's: revoked"
        assert pool.revoked == [3, 5]
    finally:
        monkeypatch.undo()
        c.close()
