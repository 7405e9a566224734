"""OrbitKV as one member of vLLM's `MultiConnector`, after `NixlConnector` (prefill/decode
disaggregation, Nixl as producer or consumer): the OrbitKV member answers exactly as it does
alone, and loads the same bytes. Nixl's scheduler side is vLLM's real one; its worker side needs
NIXL's transport, so the workers are OrbitKV's, given OrbitKV's part of each step."""

from __future__ import annotations

from pathlib import Path

import pytest
from daemon import Daemon
from harness import BLOCK, Instance


def prompt(k: int) -> list[int]:
    return [(i * 43 + 11 + k * 137) % 1000 for i in range(5 * BLOCK)] + [9]


@pytest.mark.parametrize("nixl_role", ["kv_producer", "kv_consumer"])
def test_the_orbitkv_member_answers_as_it_does_alone(
    daemon: Daemon, model_dir: Path, nixl_role: str
) -> None:
    nixl: dict[str, object] = {"kv_connector": "NixlConnector", "kv_role": nixl_role}
    writer = Instance(model_dir, f"multi-w-{nixl_role}", daemon.socket)
    alone = Instance(model_dir, f"multi-alone-{nixl_role}", daemon.socket)
    composed = Instance(model_dir, f"multi-{nixl_role}", daemon.socket, beside=nixl)
    k = 0 if nixl_role == "kv_producer" else 1
    try:
        assert type(composed.connector).__name__ == "MultiConnector"
        assert type(composed.connector._connectors[0]).__name__.startswith("Nixl")  # type: ignore[attr-defined]
        assert writer.start_of("w", prompt(k)) == 0
        assert writer.worker.worker.wait_durable(10.0)
        assert alone.start_of("a", prompt(k)) == 5 * BLOCK
        start, loaded, expected = composed.loaded("c", prompt(k))
        assert start == 5 * BLOCK and loaded == expected
        # A prefix nobody published: 0 from both (each publishes it as it computes it).
        assert composed.start_of("c2", prompt(k + 2)) == 0
        assert alone.start_of("a2", prompt(k + 4)) == 0
    finally:
        for inst in (composed, alone, writer):
            inst.close()


def test_a_prefix_loaded_on_the_prefill_side_goes_to_decode(
    daemon: Daemon, model_dir: Path
) -> None:
    """Prefill/decode: on the prefill side (Nixl the producer), a request to be decoded
    elsewhere starts from the prefix OrbitKV loads, and the blocks Nixl hands to the decode side
    are the request's own, the loaded prefix in them."""
    nixl: dict[str, object] = {"kv_connector": "NixlConnector", "kv_role": "kv_producer"}
    writer = Instance(model_dir, "pd-w", daemon.socket)
    prefill = Instance(model_dir, "pd-prefill", daemon.socket, beside=nixl)
    try:
        assert writer.start_of("w", prompt(10)) == 0
        assert writer.worker.worker.wait_durable(10.0)
        r = prefill.request("pd", prompt(10), max_tokens=1, transfer={"do_remote_decode": True})
        start, blocks = None, []
        for _ in range(50):
            so = prefill.step()
            for new in so.scheduled_new_reqs:
                if new.req_id == "pd":
                    start = new.num_computed_tokens
                    blocks = prefill.scheduler.kv_cache_manager.get_block_ids("pd")[0]
            if "pd" in prefill.transfer_params:
                break
        assert start == 5 * BLOCK, "OrbitKV's prefix"
        params = prefill.transfer_params["pd"]
        assert params["do_remote_prefill"] is True
        assert list(params["remote_block_ids"]) == [blocks]  # type: ignore[call-overload]
        loaded = [prefill.page(b) for b in blocks[:5]]
        assert loaded == [prefill.expected(bytes(h)) for h in r.block_hashes[:5]]
    finally:
        prefill.close()
        writer.close()
