"""How the worker reaches vLLM's KV memory: the geometry read off vLLM's per-layer views, in
place when they lie inside a host pool the package mapped, staged otherwise; and the parts of
the device path that need no GPU (the IPC handle torch hands out, the device's ordinal)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import orbitkv
import pytest
import torch
from daemon import Daemon
from harness import BLOCK, Instance
from orbitkv.vllm import worker
from orbitkv.vllm.pages import (
    DeviceMemory,
    daemon_ordinal,
    device_uuid,
    ipc_handle,
    page_memory,
    placement,
)

LAYERS, BLOCKS, LB = 3, 8, 256


def views(raw: torch.Tensor, layout: str) -> list[torch.Tensor]:
    """vLLM's per-layer `[block, ...]` views of one buffer (each page one run)."""
    if layout == "LBNHC":
        return [x.view(BLOCKS, 2, 8, 4, 4) for x in raw.view(LAYERS, BLOCKS, LB).unbind(0)]
    grid = raw.view(BLOCKS, LAYERS, LB)
    return [grid[:, i] for i in range(LAYERS)]


def pool_memory() -> torch.Tensor:
    pages = orbitkv.mapped.allocate(BLOCKS, LAYERS * LB).pages
    return torch.frombuffer(pages, dtype=torch.uint8)


@pytest.mark.parametrize(
    ("layout", "page_stride", "layer_stride"),
    [("LBNHC", LB, BLOCKS * LB), ("BLNHC", LAYERS * LB, LB)],
)
def test_the_geometry_of_vllms_views(layout: str, page_stride: int, layer_stride: int) -> None:
    raw = torch.zeros(LAYERS * BLOCKS * LB, dtype=torch.uint8)
    where = placement({0: views(raw, layout)}, LB, BLOCKS)
    assert where is not None
    assert where.origin == raw.data_ptr()
    (g,) = where.spec.groups
    assert (g.layers, g.offset, g.page_stride, g.layer_stride, g.layer_bytes) == (
        LAYERS,
        0,
        page_stride,
        layer_stride,
        LB,
    )
    assert where.span == raw.numel()


def test_layers_in_separate_allocations_have_no_geometry() -> None:
    layers = [torch.zeros(BLOCKS, LB, dtype=torch.uint8) for _ in range(LAYERS)]
    assert placement({0: layers}, LB, BLOCKS) is None
    assert page_memory({0: layers}, LB, BLOCKS).kind == "staged"


@pytest.mark.parametrize("layout", ["LBNHC", "BLNHC"])
def test_views_inside_a_mapped_pool_are_registered_in_place(layout: str) -> None:
    assert page_memory({0: views(pool_memory(), layout)}, LB, BLOCKS).kind == "in place"


def test_views_of_ordinary_memory_are_staged() -> None:
    raw = torch.zeros(LAYERS * BLOCKS * LB, dtype=torch.uint8)
    memory = page_memory({0: views(raw, "LBNHC")}, LB, BLOCKS)
    assert memory.kind == "staged"
    # The staging copies: a block out to the pool page and back, byte for byte.
    layers = memory.layers
    for i, x in enumerate(layers):
        x[5].view(-1).copy_(torch.arange(LB, dtype=torch.uint8) + i)
    memory.before_publish(0, 5)
    for x in layers:
        x[5].zero_()
    memory.after_load(0, 5)
    for i, x in enumerate(layers):
        assert torch.equal(x[5].reshape(-1), torch.arange(LB, dtype=torch.uint8) + i)


def test_the_ipc_handle_in_what_torch_shares() -> None:
    handle = bytes(range(64))
    assert ipc_handle(handle) == handle
    assert ipc_handle(b"\x01c" + handle) == handle
    # An expandable segment: no IPC handle opens it.
    assert ipc_handle(b"\x01e" + handle) is None
    assert ipc_handle(handle[:32]) is None


def test_the_daemons_ordinal_of_a_device(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert daemon_ordinal(1) == 1
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3, 1")
    assert (daemon_ordinal(0), daemon_ordinal(1), daemon_ordinal(2)) == (3, 1, None)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-8d3e6c1a")
    assert daemon_ordinal(0) is None


def test_a_devices_uuid_names_it_in_every_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """What torch prints (with or without `GPU-`) as 16 bytes; none without CUDA."""
    assert device_uuid(0) == bytes(16)
    text = "58b8a7b1-7a1e-4b3c-9d2f-0123456789ab"
    for shown in (text, f"GPU-{text}"):
        props = SimpleNamespace(uuid=shown)
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index, p=props: p)
        assert device_uuid(0) == bytes.fromhex(text.replace("-", ""))


def unbacked_device_pool(
    groups: dict[int, list[torch.Tensor]], layer_bytes: int, pages: int
) -> DeviceMemory:
    """The worker's page memory as on a GPU: a device pool, which this daemon refuses."""
    where = placement(groups, layer_bytes, pages)
    assert where is not None
    return DeviceMemory(groups, where, 0, bytes(64), 0)


def test_a_device_pool_the_daemon_refuses_falls_back_to_staging(
    daemon: Daemon, model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A daemon without the CUDA backend refuses the device pool; the worker stages its pages
    instead and serves as usual."""

    monkeypatch.setattr(worker, "page_memory", unbacked_device_pool)
    prompt = [(i * 71 + 17) % 1000 for i in range(4 * BLOCK)] + [2]
    p = Instance(model_dir, "no-cuda-w", daemon.socket)
    c = Instance(model_dir, "no-cuda-r", daemon.socket)
    try:
        assert p.start_of("w", prompt) == 0
        assert p.worker.worker.memory.kind == "staged", "refused as a device pool"
        assert p.worker.worker.wait_durable(10.0)
        start, loaded, expected = c.loaded("r", prompt)
        assert start == 4 * BLOCK and loaded == expected
    finally:
        c.close()
        p.close()


def test_a_staging_pool_that_cannot_be_made_leaves_the_engine_running(
    daemon: Daemon, model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The device pool is refused and the host memory to stage through cannot be had: the rank
    serves and publishes nothing, and its requests run as if there were no cache."""

    def no_memory(*_: object) -> None:
        # As HostPool reports a mapping it cannot make.
        raise orbitkv.InvalidInput("host pool: Cannot allocate memory (os error 12)")

    monkeypatch.setattr(worker, "page_memory", unbacked_device_pool)
    monkeypatch.setattr(worker, "StagedMemory", no_memory)
    prompt = [(i * 37 + 11) % 1000 for i in range(4 * BLOCK)] + [2]
    p = Instance(model_dir, "no-staging", daemon.socket)
    try:
        assert p.start_of("w", prompt) == 0
        assert not p.worker.worker.pool_ready
        assert p.worker.worker.memory is not None and p.worker.worker.memory.kind == "device"
    finally:
        p.close()
