"""A session from Python against a real `orbitkv serve`: register and seal, register pools,
publish, query, acquire, load byte-exact, a stale generation refused, release; many requests
outstanding on one connection; typed errors; a daemon that stops reading ends the connection
within the send timeout."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import orbitkv
import pytest
from conftest import SEND_TIMEOUT_MS, Daemon
from engine import Engine, payload, tokens
from orbitkv.session import session_gone

BLOCKS = 6


def publish_request(engine: Engine, rank: int, pool: orbitkv.HostPool, hashes: list[bytes]) -> list:
    """Writes each block's page of every group into `pool` (page i for block i) and returns
    the Publish's pages."""
    pages = []
    for i, h in enumerate(hashes):
        generation = pool.reuse(i)
        for g in engine.groups:
            pool.write_group(i, g.id, payload(h, g.id, rank, engine.page_bytes()))
            parent = hashes[i - 1] if i else b""
            start = i * engine.block_tokens
            pages.append(
                (
                    g.id,
                    rank,
                    h,
                    parent,
                    start,
                    start + engine.block_tokens,
                    pool.spec.pool,
                    i,
                    generation,
                )
            )
    return pages


def publish_all(
    engine: Engine, pools: list[orbitkv.HostPool], sealed: list[orbitkv.Sealed], seed: int
) -> list[bytes]:
    """Every worker publishes the blocks of request `seed`; returns their hashes."""
    hashes = orbitkv.vllm_block_hashes(
        tokens(seed, BLOCKS * engine.block_tokens), engine.block_tokens
    )
    for rank, pool in enumerate(pools):
        conn = engine.worker_conn(rank)
        copied, durable = conn.publish(
            sealed[rank].token, sealed[rank].epoch, publish_request(engine, rank, pool, hashes)
        )
        assert copied.kind == "copied" and copied.all_ok, copied
        assert durable.kind == "durable" and durable.all_ok, durable
    return hashes


def register_pools(
    engine: Engine, sealed: list[orbitkv.Sealed], pages: int
) -> list[orbitkv.HostPool]:
    pools = []
    for rank, s in enumerate(sealed):
        pool = orbitkv.HostPool(engine.spec(pool=1, pages=pages))
        assert engine.worker_conn(rank).register_pool(s.token, pool) == 1
        pools.append(pool)
    return pools


def groups_of(engine: Engine, hashes: list[bytes]) -> list[tuple[int, list[bytes]]]:
    return [(g.id, hashes) for g in engine.groups]


def test_publish_then_another_instance_acquires_loads_byte_exact_and_releases(
    daemon: Daemon,
) -> None:
    producer = Engine("py-producer", workers=2)
    _, sealed = producer.seal(daemon.socket)
    pools = register_pools(producer, sealed, BLOCKS)
    hashes = publish_all(producer, pools, sealed, seed=1)

    consumer = Engine("py-consumer", workers=2)
    sched, workers = consumer.seal(daemon.socket)
    assert sched is not None and sched.namespace == sealed[0].namespace
    consumer_pools = register_pools(consumer, workers, BLOCKS)
    sconn = consumer.conns[0]
    end = BLOCKS * consumer.block_tokens
    proof = sconn.query(sched.token, sched.epoch, 0, end, groups_of(consumer, hashes))
    assert isinstance(proof, orbitkv.Proof) and proof.boundary == end, proof
    leased = sconn.acquire(sched.token, sched.epoch, 0, end, groups_of(consumer, hashes))
    assert isinstance(leased, orbitkv.Leased), leased
    assert leased.proof.boundary == end

    for load in leased.proof.loads:
        rank, pool = load.rank, consumer_pools[load.rank]
        pages = []
        for block in load.blocks:
            generation = pool.reuse(block)
            pages.append((block, load.group, rank, 1, block, generation, 0, consumer.layers))
        statuses = consumer.worker_conn(rank).load(
            workers[rank].token, workers[rank].epoch, leased.lease, pages
        )
        assert statuses == ["ok"] * len(pages)
        for block in load.blocks:
            expected = payload(hashes[block], load.group, rank, consumer.page_bytes())
            assert pool.read_group(block, load.group) == expected

    # A page reused after its reference was taken: the load is refused for that page alone.
    pool = consumer_pools[0]
    stale = pool.generation(0)
    pool.reuse(0)
    pages = [
        (0, 0, 0, 1, 0, stale, 0, consumer.layers),
        (1, 0, 0, 1, 1, pool.generation(1), 0, consumer.layers),
    ]
    statuses = consumer.worker_conn(0).load(workers[0].token, workers[0].epoch, leased.lease, pages)
    assert statuses == ["stale_generation", "ok"]

    sconn.release(sched.token, leased.lease)
    with pytest.raises(orbitkv.RefusedError) as refused:
        consumer.worker_conn(0).load(workers[0].token, workers[0].epoch, leased.lease, pages[1:])
    assert refused.value.code == "unknown_lease"
    assert refused.value.retryable is False
    producer.close()
    consumer.close()


def test_many_requests_outstanding_on_one_connection(daemon: Daemon) -> None:
    engine = Engine("py-pipelined")
    sched, sealed = engine.seal(daemon.socket)
    assert sched is not None
    pools = register_pools(engine, sealed, BLOCKS)
    hashes = publish_all(engine, pools, sealed, seed=2)
    conn = engine.conns[0]
    end = BLOCKS * engine.block_tokens
    ids = [
        conn.submit_query(sched.token, sched.epoch, 0, end, groups_of(engine, hashes))
        for _ in range(64)
    ]
    # Taken in reverse order: each reply was filed under its own request id.
    for i in reversed(ids):
        reply = conn.wait(i, timeout=10)
        assert isinstance(reply, orbitkv.Proof) and reply.boundary == end
    # poll never blocks; a forgotten request's reply is dropped.
    first = conn.submit_query(sched.token, sched.epoch, 0, end, groups_of(engine, hashes))
    second = conn.submit_query(sched.token, sched.epoch, 0, end, groups_of(engine, hashes))
    conn.forget(first)
    assert isinstance(conn.wait(second, timeout=10), orbitkv.Proof)
    with pytest.raises(orbitkv.InvalidInput):
        conn.poll(first)

    # A Publish's two replies, polled while the connection serves a Query in between.
    worker = engine.worker_conn(0)
    pid = worker.submit_publish(
        sealed[0].token, sealed[0].epoch, publish_request(engine, 0, pools[0], hashes)
    )
    copied = worker.wait(pid, timeout=10)
    assert isinstance(copied, orbitkv.Pages) and copied.kind == "copied"
    assert isinstance(
        conn.query(sched.token, sched.epoch, 0, end, groups_of(engine, hashes)), orbitkv.Proof
    )
    durable = worker.wait(pid, timeout=10)
    assert isinstance(durable, orbitkv.Pages) and durable.kind == "durable" and durable.all_ok
    engine.close()


def test_a_worker_registers_before_its_scheduler(daemon: Daemon) -> None:
    engine = Engine("py-late-scheduler")
    worker = orbitkv.Connection(daemon.socket)
    rid = engine.submit_register(worker, "worker", 0)
    with pytest.raises(orbitkv.TimedOut):
        worker.await_seal(rid, timeout=0.5)
    got: list[orbitkv.Sealed] = []
    waiter = threading.Thread(target=lambda: got.append(worker.await_seal(rid)))
    waiter.start()
    time.sleep(0.5)
    sched = orbitkv.Connection(daemon.socket)
    s = sched.await_seal(engine.submit_register(sched, "scheduler", 0))
    waiter.join(timeout=10)
    assert got and got[0].epoch == s.epoch
    # The worker's connection serves requests under its seal.
    pool = orbitkv.HostPool(engine.spec(pool=3, pages=2))
    assert worker.register_pool(got[0].token, pool) == 3
    worker.close()
    sched.close()


def test_an_instance_without_a_scheduler_seals_with_its_workers(daemon: Daemon) -> None:
    engine = Engine("py-no-scheduler", workers=2, no_scheduler=True)
    sched, sealed = engine.seal(daemon.socket)
    assert sched is None and len({s.epoch for s in sealed}) == 1
    pools = register_pools(engine, sealed, BLOCKS)
    hashes = publish_all(engine, pools, sealed, seed=3)
    end = BLOCKS * engine.block_tokens
    # Worker 0 queries for its instance, as SGLang's ranks do.
    proof = engine.worker_conn(0).query(
        sealed[0].token, sealed[0].epoch, 0, end, groups_of(engine, hashes)
    )
    assert isinstance(proof, orbitkv.Proof) and proof.boundary == end
    engine.close()


def test_a_live_instances_name_is_refused_to_another_computation(daemon: Daemon) -> None:
    first = Engine("py-shared-name")
    first.seal(daemon.socket)
    other = Engine("py-shared-name", model="py/another-model")
    conn = orbitkv.Connection(daemon.socket)
    with pytest.raises(orbitkv.RefusedError) as refused:
        conn.await_seal(other.submit_register(conn, "scheduler", 0), timeout=10)
    assert refused.value.code == "seal_refused"
    assert "in use by a live instance" in refused.value.detail
    conn.close()
    first.close()


def test_a_forged_token_is_refused_with_its_reason(daemon: Daemon) -> None:
    conn = orbitkv.Connection(daemon.socket)
    with pytest.raises(orbitkv.RefusedError) as refused:
        conn.query(b"\x01" * 32, 1, 0, 4, [(0, [b"\x02" * 32])])
    assert refused.value.code == "bad_token"
    assert refused.value.retryable is False
    assert session_gone(refused.value), "the adapters register again"
    with pytest.raises(orbitkv.InvalidInput):
        conn.query(b"short", 1, 0, 4, [(0, [b"\x02" * 32])])
    conn.close()
    with pytest.raises(orbitkv.ConnectionLost) as lost:
        conn.query(b"\x01" * 32, 1, 0, 4, [(0, [b"\x02" * 32])])
    assert session_gone(lost.value)
    # Any other refusal leaves the session as it is (a miss, a page not stored).
    later = orbitkv.RefusedError("retry later: the disk is full")
    later.code = "retry_later"
    assert not session_gone(later)


def test_threads_share_one_connection(daemon: Daemon) -> None:
    """Four threads submit and wait on one connection at once: whichever reads the socket
    files the others' replies, and each gets its own."""
    engine = Engine("py-threads")
    sched, sealed = engine.seal(daemon.socket)
    assert sched is not None
    pools = register_pools(engine, sealed, BLOCKS)
    hashes = publish_all(engine, pools, sealed, seed=4)
    conn = engine.conns[0]
    errors: list[BaseException] = []

    def ask(blocks: int) -> None:
        try:
            end = blocks * engine.block_tokens
            for _ in range(200):
                proof = conn.query(sched.token, sched.epoch, 0, end, [(0, hashes[:blocks])])
                assert isinstance(proof, orbitkv.Proof) and proof.boundary == end, proof
        except BaseException as e:  # reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=ask, args=(b,)) for b in range(1, 5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    engine.close()


def test_replies_left_unread_are_kept_and_the_connection_stays_open(daemon: Daemon) -> None:
    """Thousands of replies nobody waits for yet: the drainer reads them off the socket, so
    the daemon never finds the connection unread, and each is there when asked for."""
    engine = Engine("py-unread")
    sched, sealed = engine.seal(daemon.socket)
    assert sched is not None
    pools = register_pools(engine, sealed, BLOCKS)
    hashes = publish_all(engine, pools, sealed, seed=5)
    conn = engine.conns[0]
    end = BLOCKS * engine.block_tokens
    # More than the socket holds; left longer than the daemon waits for a peer to read.
    ids = [conn.submit_query(sched.token, sched.epoch, 0, end, [(0, hashes)]) for _ in range(5000)]
    time.sleep(2.5 * SEND_TIMEOUT_MS / 1000)
    assert conn.closed is None
    for i in ids:
        assert isinstance(conn.poll(i), orbitkv.Proof)
    engine.close()


def test_waits_end_with_the_right_error(daemon: Daemon) -> None:
    engine = Engine("py-waits")
    sched, _ = engine.seal(daemon.socket)
    assert sched is not None
    conn = engine.conns[0]
    q = (sched.token, sched.epoch, 0, 4, [(0, [b"\x07" * 32])])
    # A huge timeout is no timeout, not a crash.
    assert isinstance(conn.wait(conn.submit_query(*q), timeout=1e300), orbitkv.Miss)
    # Nothing is due for a request taken, forgotten, or never sent: no wait for ever.
    done = conn.submit_query(*q)
    conn.wait(done)
    forgotten = conn.submit_query(*q)
    conn.forget(forgotten)
    for request in [done, forgotten, 10**9]:
        with pytest.raises(orbitkv.InvalidInput):
            conn.wait(request)
        with pytest.raises(orbitkv.InvalidInput):
            conn.poll(request)
    with pytest.raises(orbitkv.InvalidInput):
        conn.wait(conn.submit_query(*q), timeout=-1)
    # close() from another thread ends a wait that has no timeout.
    worker = orbitkv.Connection(daemon.socket)
    # Worker 0 of a two-worker instance whose other ranks never come: it never seals.
    pending = Engine("py-waits-alone", workers=2).submit_register(worker, "worker", 0)
    with pytest.raises(orbitkv.TimedOut):
        worker.await_seal(pending, timeout=0.05)
    errors: list[BaseException] = []

    def waiter() -> None:
        try:
            worker.await_seal(pending)
        except BaseException as e:  # reported by the main thread
            errors.append(e)

    t = threading.Thread(target=waiter)
    t.start()
    time.sleep(0.2)
    worker.close()
    t.join(timeout=10)
    assert not t.is_alive()
    assert len(errors) == 1 and isinstance(errors[0], orbitkv.ConnectionLost), errors
    assert worker.closed is not None and "close()" in worker.closed
    engine.close()


def test_a_daemon_that_stops_reading_ends_the_connection_within_the_send_timeout(
    tmp_path: Path,
) -> None:
    """A daemon stopped with its socket open reads nothing. Once the socket's buffer is full, a
    submit that moves no byte within `send_timeout` ends the connection (`ConnectionLost`)
    rather than blocking it, and every thread waiting to submit, for good."""
    d = Daemon(tmp_path)
    conn = orbitkv.Connection(d.socket, send_timeout=0.5)
    with pytest.raises(orbitkv.InvalidInput):
        orbitkv.Connection(d.socket, send_timeout=0.0)
    # About 8 KiB a request: the socket's buffer (a few hundred KiB) fills in tens of them.
    q = (b"\x01" * 32, 1, 0, 256, [(0, [bytes([i]) * 32 for i in range(256)])])
    raised: list[BaseException] = []

    def submit() -> None:
        try:
            for _ in range(100_000):
                conn.submit_query(*q)
        except BaseException as e:  # reported by the test's thread
            raised.append(e)

    d.pause()
    try:
        start = time.monotonic()
        submitter = threading.Thread(target=submit, daemon=True)
        submitter.start()
        submitter.join(timeout=10.0)
        took = time.monotonic() - start
        assert not submitter.is_alive(), "a submit blocked past the send timeout"
        assert len(raised) == 1 and isinstance(raised[0], orbitkv.ConnectionLost), raised
        assert "send_timeout" in str(raised[0])
        assert took < 5.0, took
        # The connection is over: a later submit fails at once, as does a wait.
        assert conn.closed is not None
        start = time.monotonic()
        with pytest.raises(orbitkv.ConnectionLost):
            conn.submit_query(*q)
        assert time.monotonic() - start < 0.5
    finally:
        d.resume()
        conn.close()
        d.stop()


def test_a_pool_registration_waits_only_its_timeout(tmp_path: Path) -> None:
    """A daemon that stalls after the seal holds a pool registration up to its `timeout`, not
    for good; its late reply is dropped and the connection stays usable."""
    d = Daemon(tmp_path)
    engine = Engine("py-pool-wait")
    try:
        _, sealed = engine.seal(d.socket)
        conn = engine.worker_conn(0)
        pool = orbitkv.HostPool(engine.spec(pool=1, pages=BLOCKS))
        d.pause()
        try:
            start = time.monotonic()
            with pytest.raises(orbitkv.TimedOut):
                conn.register_pool(sealed[0].token, pool, timeout=0.3)
            assert time.monotonic() - start < 2.0
        finally:
            d.resume()
        # The late PoolRegistered is not kept: the next request's reply is its own.
        assert isinstance(
            conn.query(sealed[0].token, sealed[0].epoch, 0, 4, [(0, [b"\x07" * 32])]), orbitkv.Miss
        )
        assert conn.closed is None
    finally:
        engine.close()
        d.stop()


def test_publishes_are_cut_within_the_daemons_limits() -> None:
    from orbitkv.session import PUBLISH_CHUNK_BYTES, PUBLISH_CHUNK_PAGES, chunks

    assert chunks([]) == []
    assert chunks([10] * 5) == [range(0, 5)]
    n = PUBLISH_CHUNK_PAGES
    assert chunks([1] * (n + 1)) == [range(0, n), range(n, n + 1)]
    half = PUBLISH_CHUNK_BYTES // 2
    assert chunks([half, half, 1, half]) == [range(0, 2), range(2, 4)]
    # A page larger than the limit goes alone.
    assert chunks([1, 2 * PUBLISH_CHUNK_BYTES, 1]) == [range(0, 1), range(1, 2), range(2, 3)]
