"""vLLM's defaults on a GPU: async scheduling (the next step is scheduled before the last one's
output comes back) and model runner V2 (a step's new blocks are zeroed, for a Mamba model,
before the connector's first call of the step). Leases are given back only once the workers
ran their loads; a Mamba state is copied out before its block can be handed out and zeroed; a
request aborted while it waits for a load after a preemption ends cleanly."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from daemon import Daemon
from harness import BLOCK, Instance
from orbitkv.vllm import pages
from test_mamba import CHUNKED, DENSE
from vllm.v1.request import Request, RequestStatus


def prompt(k: int, blocks: int = 5) -> list[int]:
    return [(i * 43 + 11 + k * 137) % 1000 for i in range(blocks * BLOCK)] + [9]


def answered(inst: Instance, r: Request) -> int:
    """The connector's answer for `r`, once its Query is back."""
    for _ in range(200):
        n, _ = inst.orbitkv.scheduler.matched_tokens(r, 0)
        if n is not None:
            return int(n)
        time.sleep(0.01)
    raise AssertionError("no answer")


def test_a_lease_outlives_the_step_scheduled_before_its_load(
    daemon: Daemon, model_dir: Path
) -> None:
    p = Instance(model_dir, "as-w", daemon.socket)
    c = Instance(model_dir, "as-r", daemon.socket)
    try:
        assert p.start_of("w", prompt(1)) == 0
        assert p.worker.worker.wait_durable(10.0)
        c.request("A", prompt(50))
        step_n = c.scheduler.schedule()
        out_n = c.run_workers(step_n)
        b = c.new_request("B", prompt(1))
        assert answered(c, b) == 5 * BLOCK
        c.scheduler.add_request(b)
        # Step N+1 is scheduled (B's lease acquired, its load in the step) before step N's
        # output comes back.
        step_n1 = c.scheduler.schedule()
        assert b.status == RequestStatus.WAITING_FOR_REMOTE_KVS
        c.update(step_n, out_n)
        assert c.orbitkv.scheduler.leases, "B's lease is still held"
        out_n1 = c.run_workers(step_n1)
        assert not out_n1.invalid_block_ids, "B's load ran under its lease"
        assert out_n1.finished_recving == {"B"}
        c.update(step_n1, out_n1)
        assert not c.orbitkv.scheduler.leases, "given back once the workers loaded"
        step = c.step()
        assert [x.num_computed_tokens for x in step.scheduled_new_reqs] == [5 * BLOCK]
        c.run()
    finally:
        c.close()
        p.close()


class LateFence:
    """A step's CUDA event still pending when `wait_for_save` returns (async scheduling),
    complete only when waited for."""

    def __init__(self) -> None:
        self.done = False

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        self.done = True


@pytest.mark.parametrize("shared", [2, 4])
def test_a_mamba_state_is_copied_out_before_its_block_is_zeroed(
    daemon: Daemon, mamba_model_dir: Path, monkeypatch: pytest.MonkeyPatch, shared: int
) -> None:
    """Model runner V2 zeroes a step's new blocks before `handle_preemptions`: the state
    offered at a boundary, whose block vLLM frees a step later, is copied out within its own
    step, and a consumer resuming there loads that state, not zeros."""
    monkeypatch.setattr(pages.InPlaceMemory, "fence", lambda self: LateFence())
    p = Instance(
        mamba_model_dir, f"v2-w{shared}", daemon.socket, args=DENSE, blocks=12, runner="v2"
    )
    c = Instance(mamba_model_dir, f"v2-r{shared}", daemon.socket, args=CHUNKED, memory="allocate")
    written = prompt(60 + shared, blocks=8)
    try:
        assert p.start_of("w", written) == 0
        assert p.worker.worker.wait_durable(10.0)
        # A prompt sharing only the first blocks: the state at their end is the one resumed.
        asked = written[: shared * BLOCK] + prompt(70 + shared, blocks=8)[shared * BLOCK :]
        start, r = c.first_step("r", asked)
        assert start == shared * BLOCK
        hashes = [bytes(h) for h in r.block_hashes]
        for g, blocks in enumerate(c.scheduler.kv_cache_manager.get_block_ids("r")):
            held = [shared - 1] if c._mamba(g) else list(range(shared))
            assert [c.page(blocks[i], g) for i in held] == [c.expected(hashes[i], g) for i in held]
        c.run()
    finally:
        c.close()
        p.close()


def test_a_request_aborted_while_it_waits_for_a_load_ends_cleanly(
    daemon: Daemon, model_dir: Path
) -> None:
    """A hybrid request publishes, is preempted, comes back waiting for an asynchronous load
    and is aborted then: its blocks are freed once, without a report vLLM does not expect."""
    p = Instance(model_dir, "as-abort", daemon.socket, window=32)
    try:
        r = p.request("g", prompt(90, blocks=8), max_tokens=40)
        for _ in range(22):
            p.step()
        assert p.worker.worker.wait_durable(10.0)
        assert "g" in p.orbitkv.scheduler.publishing
        # vLLM preempts every running request (and drops its local prefix cache).
        assert p.scheduler.reset_prefix_cache(reset_running_requests=True)
        aborted = False
        deadline = time.monotonic() + 10
        while p.scheduler.has_requests() and time.monotonic() < deadline:
            so = p.scheduler.schedule()
            if r.status == RequestStatus.WAITING_FOR_REMOTE_KVS and not aborted:
                p.scheduler.finish_requests("g", RequestStatus.FINISHED_ABORTED)
                aborted = True
            p.update(so, p.run_workers(so))
        assert aborted, "the request waited for its load"
        assert not p.scheduler.has_requests()
    finally:
        p.close()
