"""A hybrid model (full attention beside sliding-window attention), with groups from vLLM's own
planner: every group is published as its blocks fill, a consumer loads the full group's prefix
and the window group's trailing window byte for byte, and the boundary the daemon proves is the
one vLLM's own hybrid coordinator accepts for the same records."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from daemon import Daemon
from harness import BLOCK, Instance
from judge import proves_as_vllm, published
from orbitkv.vllm import worker
from orbitkv.vllm.metadata import OrbitKVMetadata

# The odd layers attend over 32 tokens: a boundary needs the 2 blocks before it.
WINDOW = 32
# Chunks of 4 blocks: the window group's blocks behind the window are freed mid-prompt.
CHUNKED: dict[str, object] = {"max_num_batched_tokens": 4 * BLOCK}


def prompt(k: int, blocks: int = 8) -> list[int]:
    return [(i * 73 + 29 + k * 211) % 1000 for i in range(blocks * BLOCK)] + [3]


def test_groups_come_from_vllms_planner(daemon: Daemon, model_dir: Path) -> None:
    inst = Instance(model_dir, "hy-plan", daemon.socket, window=WINDOW)
    try:
        groups = inst.worker.worker.groups
        assert [(g.group, g.kind, g.window) for g in groups] == [(0, "full", 0), (1, "window", 32)]
        assert inst.worker.worker.memory.kind == "in place"
        assert inst.worker.worker.memory.states.spec.aliased
    finally:
        inst.close()


@pytest.mark.parametrize("memory", ["pool", "allocate"])
def test_a_hybrid_prefix_round_trips_byte_for_byte(
    daemon: Daemon, model_dir: Path, memory: str
) -> None:
    p = Instance(model_dir, f"hy-w-{memory}", daemon.socket, window=WINDOW, args=CHUNKED)
    c = Instance(model_dir, f"hy-r-{memory}", daemon.socket, window=WINDOW, memory=memory)
    tokens = prompt(0 if memory == "pool" else 1)
    try:
        assert p.start_of("w", tokens) == 0
        assert p.worker.worker.wait_durable(10.0)
        start, r = c.first_step("r", tokens)
        assert start == 8 * BLOCK
        full, window = c.scheduler.kv_cache_manager.get_block_ids("r")
        hashes = [bytes(h) for h in r.block_hashes[:8]]
        assert [c.page(b, 0) for b in full[:8]] == [c.expected(h, 0) for h in hashes]
        # The window group holds the 2 blocks before the boundary; those before are null.
        assert window[:6] == [0] * 6
        assert [c.page(b, 1) for b in window[6:8]] == [c.expected(h, 1) for h in hashes[6:]]
        c.run()
    finally:
        c.close()
        p.close()


def test_the_boundary_is_the_one_vllms_coordinator_accepts(
    daemon: Daemon, model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A record of the window group missing (block 6) or of the full group missing (block 3):
    the daemon proves what vLLM's hybrid coordinator accepts for the records it holds."""
    drop: set[tuple[int, int]] = set()
    records = published(monkeypatch, drop)
    for k, dropped, expect in [(2, {(1, 6)}, 6), (3, {(0, 3)}, 3), (4, set(), 8)]:
        drop.clear()
        drop.update(dropped)
        records.clear()
        p = Instance(model_dir, f"hy-judge-w{k}", daemon.socket, window=WINDOW, args=CHUNKED)
        c = Instance(model_dir, f"hy-judge-r{k}", daemon.socket, window=WINDOW)
        try:
            proves_as_vllm(p, c, prompt(k), records, expect)
        finally:
            c.close()
            p.close()


def test_a_failed_load_is_recomputed_from_the_start(
    daemon: Daemon, model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM cannot map a failed block of a hybrid model back to its request: the load is
    asynchronous and a failure fails the whole request, which vLLM recomputes."""
    p = Instance(model_dir, "hy-fail-w", daemon.socket, window=WINDOW)
    c = Instance(model_dir, "hy-fail-r", daemon.socket, window=WINDOW)
    try:
        assert p.start_of("w", prompt(5)) == 0
        assert p.worker.worker.wait_durable(10.0)
        monkeypatch.setattr(
            worker.WorkerSide, "_load_pages", lambda self, live, lease, mine: [mine[0][2]]
        )
        assert c.start_of("r", prompt(5)) == 0
        assert c.worker.worker.stats["loaded_bytes"] == 0
    finally:
        c.close()
        p.close()


def test_a_block_handed_out_while_its_publish_copies_waits_for_the_copy(
    daemon: Daemon, model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A window block leaves the window and vLLM hands it out again at once: before the step
    that writes it runs, the worker waits for the publish still copying out of it, and revokes
    its pages if the copy is not out by then (the daemon discards a late copy)."""
    inst = Instance(model_dir, "hy-reuse", daemon.socket, window=WINDOW)
    side = inst.worker.worker
    waits: list[float] = []
    monkeypatch.setattr(side, "_poll", lambda timeout=0.0: waits.append(timeout))
    try:
        conn = side.session.conn
        assert conn is not None and side.pool is not None
        published = worker.Published(1, {"r"}, [7, 8], conn, time.monotonic())
        side.in_flight.append(published)
        side.preempted(OrbitKVMetadata(allocated={3, 4}))
        assert waits == [], "no block of a publish in flight handed out"
        assert side.in_flight == [published]
        before = [side.pool.generation(b) for b in (7, 8)]
        side.preempted(OrbitKVMetadata(allocated={8}))
        assert waits == [worker.COPIED_WAIT]
        assert side.in_flight == [], "given up on once the wait is over"
        assert [side.pool.generation(b) for b in (7, 8)] != before, "its pages revoked"
    finally:
        side.in_flight.clear()
        inst.close()


def test_a_proof_that_grew_after_the_query_loads_what_vllm_allocated_for(
    daemon: Daemon, model_dir: Path
) -> None:
    """The Query answered 4 blocks; another instance published the rest before vLLM admitted
    the request. vLLM allocated for 4 blocks: the window those 4 end with is loaded, not the
    one a longer proof would end with."""
    shared = Instance(model_dir, "hy-grow-a", daemon.socket, window=WINDOW)
    later = Instance(model_dir, "hy-grow-b", daemon.socket, window=WINDOW)
    c = Instance(model_dir, "hy-grow-r", daemon.socket, window=WINDOW, memory="allocate")
    tokens = prompt(9)
    other = tokens[: 4 * BLOCK] + [(i * 7 + 500) % 1000 for i in range(4 * BLOCK)] + [3]
    try:
        assert shared.start_of("x", other) == 0
        assert shared.worker.worker.wait_durable(10.0)
        r = c.new_request("r", tokens)
        answer = None
        for _ in range(200):
            answer, _ = c.orbitkv.scheduler.matched_tokens(r, 0)
            if answer is not None:
                break
            time.sleep(0.01)
        assert answer == 4 * BLOCK
        assert later.start_of("y", tokens) == 4 * BLOCK
        assert later.worker.worker.wait_durable(10.0)
        c.scheduler.add_request(r)
        while not any(x.req_id == "r" for x in c.step().scheduled_new_reqs):
            pass
        full, window = c.scheduler.kv_cache_manager.get_block_ids("r")
        hashes = [bytes(h) for h in r.block_hashes]
        assert [i for i in range(4) if window[i]] == [2, 3]
        assert [c.page(full[i], 0) for i in range(4)] == [c.expected(h, 0) for h in hashes[:4]]
        assert [c.page(window[i], 1) for i in (2, 3)] == [c.expected(h, 1) for h in hashes[2:4]]
        c.run()
    finally:
        c.close()
        later.close()
        shared.close()
