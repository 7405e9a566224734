"""The placements real engines use, from Python: a layer-outermost pool (vLLM) loading what a
page-outermost one (BLNHC) published, aliased groups whose pages move between groups, a pool in
memory the engine allocated (a memfd, SGLang's `shm` allocator), and a pool per component."""

from __future__ import annotations

import os

import orbitkv
import pytest
from conftest import Daemon
from engine import Engine, Group, payload, tokens
from test_session import BLOCKS, groups_of, publish_all, publish_request, register_pools


def load_all(
    engine: Engine, leased: orbitkv.Leased, workers: list[orbitkv.Sealed], pools: list
) -> None:
    """Loads every proven block into page `block` of its rank's pool; checks the statuses."""
    for load in leased.proof.loads:
        pool = pools[load.rank]
        pages = [
            (
                b,
                load.group,
                load.rank,
                pool.spec.pool,
                b,
                pool.reuse(b) if load.group == 0 else pool.generation(b),
                0,
                engine.layers,
            )
            for b in load.blocks
        ]
        statuses = engine.worker_conn(load.rank).load(
            workers[load.rank].token, workers[load.rank].epoch, leased.lease, pages
        )
        assert statuses == ["ok"] * len(pages), statuses


def test_a_layer_outermost_pool_loads_what_a_page_outermost_one_published(daemon: Daemon) -> None:
    producer = Engine("py-page", placement="page")
    _, sealed = producer.seal(daemon.socket)
    hashes = publish_all(producer, register_pools(producer, sealed, BLOCKS), sealed, seed=10)

    consumer = Engine("py-layer", placement="layer")
    sched, workers = consumer.seal(daemon.socket)
    assert sched is not None
    pools = register_pools(consumer, workers, BLOCKS)
    end = BLOCKS * consumer.block_tokens
    leased = consumer.conns[0].acquire(
        sched.token, sched.epoch, 0, end, groups_of(consumer, hashes)
    )
    assert isinstance(leased, orbitkv.Leased) and leased.proof.boundary == end
    load_all(consumer, leased, workers, pools)
    for b in range(BLOCKS):
        assert pools[0].read_group(b, 0) == payload(hashes[b], 0, 0, consumer.page_bytes())
    # The bytes really are placed layer-outermost: page 1's layer 0 K run follows page 0's.
    run = consumer.layer_bytes() // 2
    assert pools[0].read(0, run, run) == payload(hashes[1], 0, 0, consumer.page_bytes())[:run]
    producer.close()
    consumer.close()


def test_aliased_groups_share_pages_fenced_by_one_state_word(daemon: Daemon) -> None:
    groups = (Group(0), Group(1, component="sliding_window_kv", rule="window", param=8))
    engine = Engine("py-aliased", groups=groups, aliased=True)
    sched, sealed = engine.seal(daemon.socket)
    assert sched is not None
    spec = engine.spec(pool=1, pages=2 * BLOCKS)
    assert spec.aliased and spec.page_bytes == engine.page_bytes()
    pool = orbitkv.HostPool(spec)
    engine.worker_conn(0).register_pool(sealed[0].token, pool)
    hashes = orbitkv.vllm_block_hashes(
        tokens(11, BLOCKS * engine.block_tokens), engine.block_tokens
    )
    # Group 0's block i in page i, group 1's in page BLOCKS + i: one set of bytes per page.
    pages = []
    for i, h in enumerate(hashes):
        for g in groups:
            index = i if g.id == 0 else BLOCKS + i
            generation = pool.reuse(index)
            pool.write_group(index, g.id, payload(h, g.id, 0, engine.page_bytes()))
            start = i * engine.block_tokens
            pages.append(
                (
                    g.id,
                    0,
                    h,
                    hashes[i - 1] if i else b"",
                    start,
                    start + engine.block_tokens,
                    1,
                    index,
                    generation,
                )
            )
    copied, durable = engine.worker_conn(0).publish(sealed[0].token, sealed[0].epoch, pages)
    assert copied.all_ok and durable.all_ok, (copied, durable)
    # Load group 1's last block into page 0, which group 0's block 0 held: the page moved.
    end = BLOCKS * engine.block_tokens
    leased = engine.conns[0].acquire(sched.token, sched.epoch, 0, end, groups_of(engine, hashes))
    assert isinstance(leased, orbitkv.Leased) and leased.proof.boundary == end
    window = next(load for load in leased.proof.loads if load.group == 1)
    last = window.blocks[-1]
    statuses = engine.worker_conn(0).load(
        sealed[0].token,
        sealed[0].epoch,
        leased.lease,
        [(last, 1, 0, 1, 0, pool.reuse(0), 0, engine.layers)],
    )
    assert statuses == ["ok"]
    assert pool.read_group(0, 1) == payload(hashes[last], 1, 0, engine.page_bytes())
    # A reference to page 0 taken before the load's reuse is stale for every group.
    old = pool.generation(0) - 1
    statuses = engine.worker_conn(0).load(
        sealed[0].token, sealed[0].epoch, leased.lease, [(0, 0, 0, 1, 0, old, 0, engine.layers)]
    )
    assert statuses == ["stale_generation"]
    engine.close()


def test_a_pool_in_memory_the_engine_allocated(daemon: Daemon) -> None:
    engine = Engine("py-engine-memory")
    sched, sealed = engine.seal(daemon.socket)
    assert sched is not None
    spec = engine.spec(pool=2, pages=BLOCKS)
    states = orbitkv.HostPool(spec, states_only=True)
    offset = 4096
    fd = os.memfd_create("engine-pool")
    try:
        os.ftruncate(fd, offset + spec.page_bytes * spec.pages)
        conn = engine.worker_conn(0)
        assert conn.register_engine_memory_pool(sealed[0].token, states, fd, offset) == 2
        hashes = orbitkv.vllm_block_hashes(
            tokens(12, BLOCKS * engine.block_tokens), engine.block_tokens
        )
        pages = []
        for i, h in enumerate(hashes):
            generation = states.reuse(i)
            # The engine writes its own memory: page i at offset + i * page_bytes.
            os.pwrite(fd, payload(h, 0, 0, engine.page_bytes()), offset + i * spec.page_bytes)
            start = i * engine.block_tokens
            pages.append(
                (
                    0,
                    0,
                    h,
                    hashes[i - 1] if i else b"",
                    start,
                    start + engine.block_tokens,
                    2,
                    i,
                    generation,
                )
            )
        copied, durable = conn.publish(sealed[0].token, sealed[0].epoch, pages)
        assert copied.all_ok and durable.all_ok, (copied, durable)
        end = BLOCKS * engine.block_tokens
        leased = engine.conns[0].acquire(
            sched.token, sched.epoch, 0, end, groups_of(engine, hashes)
        )
        assert isinstance(leased, orbitkv.Leased)
        # Cleared, then loaded back into the engine's memory by the daemon.
        os.pwrite(fd, bytes(spec.page_bytes * spec.pages), offset)
        load = [(b, 0, 0, 2, b, states.reuse(b), 0, engine.layers) for b in range(BLOCKS)]
        assert conn.load(sealed[0].token, sealed[0].epoch, leased.lease, load) == ["ok"] * BLOCKS
        for b in range(BLOCKS):
            got = os.pread(fd, engine.page_bytes(), offset + b * spec.page_bytes)
            assert got == payload(hashes[b], 0, 0, engine.page_bytes())
        # A states-only pool has no page bytes of its own.
        with pytest.raises(orbitkv.InvalidInput):
            states.read_group(0, 0)
        # A descriptor that is not open is refused before anything is sent.
        with pytest.raises(orbitkv.InvalidInput):
            conn.register_engine_memory_pool(sealed[0].token, states, 1_000_000, offset)
    finally:
        os.close(fd)
    engine.close()


def test_a_pool_per_component_holds_only_its_group(daemon: Daemon) -> None:
    groups = (Group(0), Group(1, component="sliding_window_kv", rule="window", param=8))
    engine = Engine("py-per-component", groups=groups)
    _, sealed = engine.seal(daemon.socket)
    conn = engine.worker_conn(0)
    pools = []
    for g in groups:
        pool = orbitkv.HostPool(engine.spec(pool=10 + g.id, pages=BLOCKS, groups=(g,)))
        conn.register_pool(sealed[0].token, pool)
        pools.append(pool)
    hashes = orbitkv.vllm_block_hashes(
        tokens(13, BLOCKS * engine.block_tokens), engine.block_tokens
    )
    one = Engine(engine.name, groups=(groups[0],))
    pages = publish_request(one, 0, pools[0], hashes)
    # Group 1's page named in group 0's pool: that page alone fails.
    bad = (1, 0, hashes[0], b"", 0, engine.block_tokens, 10, 0, pools[0].generation(0))
    copied, _ = conn.publish(sealed[0].token, sealed[0].epoch, [*pages, bad])
    assert copied.statuses[:-1] == ["ok"] * len(pages)
    assert copied.statuses[-1] == "bad_geometry"
    # A pool naming a group the layout lacks is refused at registration.
    stray = orbitkv.HostPool(Engine("x", groups=(Group(7),)).spec(pool=20, pages=2))
    with pytest.raises(orbitkv.RefusedError):
        conn.register_pool(sealed[0].token, stray)
    engine.close()
