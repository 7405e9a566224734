"""Where the daemon copies one rank's pages from and into.

vLLM's own KV memory is registered in place when the daemon can reach it: a CUDA allocation by
its IPC handle (a device pool), or host memory inside a pool the package mapped (`orbitkv.mapped`).
Anything else (ordinary CPU tensors, a daemon without the CUDA backend) is staged through a host
pool this rank owns: one copy each way, between vLLM's page and the pool page of the same index.
Either way a states pool fences every page with its generation.

Nothing here imports vLLM: a GPU check drives it with torch alone."""

from __future__ import annotations

import logging
import mmap
import os
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import orbitkv
from orbitkv.mapped import Mapping

if TYPE_CHECKING:
    import torch

log = logging.getLogger("orbitkv.vllm")

# The rank's pool id.
POOL = 1
# How long a pool registration waits for its reply: it runs in a worker's step, on a seal.
POOL_WAIT = 30.0


class Fence(Protocol):
    """The engine's writes issued so far (a CUDA event): done or not."""

    def query(self) -> bool: ...
    def synchronize(self) -> None: ...


@dataclass(frozen=True)
class Placement:
    """Where every layer's page of each block lies, from the address of layer 0's block 0."""

    origin: int
    spec: orbitkv.PoolSpec

    @property
    def span(self) -> int:
        """Bytes from the origin the pages cover (the spec validated: every run inside)."""
        return self.spec.pages * self.spec.page_bytes


def placement(
    groups: dict[int, list[torch.Tensor]], layer_bytes: int, pages: int
) -> Placement | None:
    """The pool geometry of vLLM's per-layer views of each group (each `[block, ...]`, a
    block's page one run), or `None` when no geometry describes them (layers not equally
    spaced, or apart). Several groups alias the same bytes (vLLM's hybrid allocator: a block
    belongs to one group at a time): each must start where the others do, with the same
    strides."""
    layers = [x for group in groups.values() for x in group]
    if not all(groups.values()):
        return None
    # Strides in bytes: a Mamba layer's view is bytes, an attention layer's its dtype.
    strides = {x.stride(0) * x.element_size() for x in layers}
    if len(strides) != 1 or not all(_one_run(x, layer_bytes) for x in layers):
        return None
    page_stride = strides.pop()
    geometries, origins, layer_strides = [], set(), set()
    for group, views in groups.items():
        starts = [x.data_ptr() for x in views]
        layer_stride = starts[1] - starts[0] if len(starts) > 1 else layer_bytes
        if layer_stride <= 0 or any(
            a != starts[0] + i * layer_stride for i, a in enumerate(starts)
        ):
            return None
        origins.add(starts[0])
        if len(starts) > 1:
            layer_strides.add(layer_stride)
        geometries.append((group, len(views), layer_stride))
    if len(origins) != 1 or len(layer_strides) > 1:
        return None
    most = max(n for _, n, _ in geometries)
    common = layer_strides.pop() if layer_strides else layer_bytes
    try:
        spec = orbitkv.PoolSpec(
            pool=POOL,
            page_bytes=layer_bytes * most,
            pages=pages,
            groups=[
                orbitkv.GroupGeometry(
                    group=group,
                    layers=n,
                    offset=0,
                    page_stride=page_stride,
                    layer_stride=common,
                    layer_bytes=layer_bytes,
                )
                for group, n, _ in geometries
            ],
            aliased=len(geometries) > 1,
        )
    except orbitkv.OrbitKVError:
        return None
    return Placement(origins.pop(), spec)


def _one_run(layer: torch.Tensor, layer_bytes: int) -> bool:
    """A block's page of `layer` is one run of at most `layer_bytes` (a Mamba layer's states
    fill its page only in part)."""
    x = layer[0]
    order = sorted(range(x.dim()), key=lambda d: -x.stride(d))
    return bool(x.permute(order).is_contiguous()) and x.numel() * x.element_size() <= layer_bytes


def page_run(layer: torch.Tensor, block: int) -> torch.Tensor:
    """Layer `layer`'s page `block` in memory order (one run: the layouts mapped)."""
    x = layer[block]
    order = sorted(range(x.dim()), key=lambda d: -x.stride(d))
    return x.permute(order)


class PageMemory:
    """A rank's page memory as the daemon reaches it, fenced by `states`."""

    kind = ""
    # vLLM's per-layer views, by group.
    groups: dict[int, list[torch.Tensor]]
    states: orbitkv.HostPool

    @property
    def layers(self) -> list[torch.Tensor]:
        """Every group's layers, group by group."""
        return [x for group in self.groups.values() for x in group]

    def register(self, conn: orbitkv.Connection, token: bytes) -> None:
        raise NotImplementedError

    def before_publish(self, group: int, block: int) -> None:
        """Makes group `group`'s block `block` what the daemon copies out (nothing when in
        place)."""

    def after_load(self, group: int, block: int) -> None:
        """Makes what the daemon loaded group `group`'s block `block` (nothing when in
        place)."""

    def fence(self) -> Fence | None:
        """What a Publish of the blocks written so far must wait for; `None`: nothing."""
        return None

    def before_load(self) -> None:
        """Waits until the engine's work queued so far is done, when the daemon's copies into
        its memory are not ordered after it (nothing for host memory)."""


class StagedMemory(PageMemory):
    """A host pool of this rank's own, one page per vLLM block, every layer of the block's
    group packed (groups alias, as vLLM's do); the copies in and out are synchronous."""

    kind = "staged"

    def __init__(self, groups: dict[int, list[torch.Tensor]], layer_bytes: int, pages: int) -> None:
        import torch

        self.groups = groups
        most = max(len(views) for views in groups.values())
        page = layer_bytes * most
        spec = orbitkv.PoolSpec(
            pool=POOL,
            page_bytes=page,
            pages=pages,
            groups=[
                orbitkv.GroupGeometry.packed(
                    group=group,
                    layers=len(views),
                    offset=0,
                    layer_stride=layer_bytes,
                    layer_bytes=layer_bytes,
                    page_bytes=page,
                )
                for group, views in groups.items()
            ],
            aliased=len(groups) > 1,
        )
        self.states = orbitkv.HostPool(spec)
        self._map = mmap.mmap(self.states.fd, self.states.data_offset + page * pages)
        data = torch.frombuffer(self._map, dtype=torch.uint8)
        self._pages = data[self.states.data_offset :].view(pages, most, layer_bytes)

    def register(self, conn: orbitkv.Connection, token: bytes) -> None:
        conn.register_pool(token, self.states, timeout=POOL_WAIT)

    def before_publish(self, group: int, block: int) -> None:
        import torch

        for i, layer in enumerate(self.groups[group]):
            src = page_run(layer, block).contiguous().view(torch.uint8).reshape(-1)
            self._pages[block, i, : src.numel()].copy_(src)

    def after_load(self, group: int, block: int) -> None:
        for i, layer in enumerate(self.groups[group]):
            dst = page_run(layer, block)
            run = self._pages[block, i, : dst.numel() * dst.element_size()]
            dst.copy_(run.view(layer.dtype).view(dst.shape))


class InPlaceMemory(PageMemory):
    """vLLM's pages inside a host pool the package mapped: registered as engine memory, the
    daemon copying straight into and out of them."""

    kind = "in place"

    def __init__(
        self, groups: dict[int, list[torch.Tensor]], where: Placement, found: tuple[Mapping, int]
    ) -> None:
        self.groups = groups
        self.states = orbitkv.HostPool(where.spec, states_only=True)
        self._region, self._offset = found

    def register(self, conn: orbitkv.Connection, token: bytes) -> None:
        conn.register_engine_memory_pool(
            token, self.states, self._region.pool.fd, self._offset, timeout=POOL_WAIT
        )


class DeviceMemory(PageMemory):
    """vLLM's pages in one CUDA allocation: a device pool named by the allocation's IPC handle.
    A Publish waits for the step's kernels (a CUDA event on the current stream): the daemon
    copies on a stream of its own."""

    kind = "device"

    def __init__(
        self,
        groups: dict[int, list[torch.Tensor]],
        where: Placement,
        device: int,
        handle: bytes,
        offset: int,
        uuid: bytes = bytes(16),
    ) -> None:
        self.groups = groups
        self.states = orbitkv.HostPool(where.spec, states_only=True)
        self._device = device
        self._handle = handle
        self._offset = offset
        self._uuid = uuid

    def register(self, conn: orbitkv.Connection, token: bytes) -> None:
        conn.register_device_pool(
            token,
            self.states,
            self._device,
            self._handle,
            self._offset,
            self._uuid,
            timeout=POOL_WAIT,
        )

    def fence(self) -> Fence | None:
        import torch

        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(self.layers[0].device))
        return event

    def before_load(self) -> None:
        """A block handed to a new request may still be read by a step in flight (async
        scheduling): the daemon's copy into it waits for the stream."""
        fence = self.fence()
        if fence is not None:
            fence.synchronize()


def ipc_handle(shared: bytes) -> bytes | None:
    """The 64-byte `cuIpcMemHandle` in what torch's `_share_cuda_` returns: the handle itself,
    or (torch ≥ 2.2) a version byte, `c` (a `cudaMalloc` segment), then the handle. `None` for
    memory no IPC handle opens (`e`: an expandable segment)."""
    if len(shared) == 64:
        return shared
    if len(shared) == 66 and shared[1:2] == b"c":
        return shared[2:]
    return None


def device_uuid(index: int) -> bytes:
    """The 16-byte UUID of this process's CUDA device `index`, the same in every process (the
    daemon opens the device by it, whatever `CUDA_VISIBLE_DEVICES` says here); 16 zero bytes
    when torch does not say."""
    import torch

    try:
        text = str(torch.cuda.get_device_properties(index).uuid)
        return uuid.UUID(text.removeprefix("GPU-")).bytes
    except Exception:  # an old torch, or no UUID: the ordinal names the device
        return bytes(16)


def daemon_ordinal(index: int) -> int | None:
    """The ordinal of this process's CUDA device `index` among all devices (as a daemon that
    sees every device numbers it), through `CUDA_VISIBLE_DEVICES`; `None` when that names
    devices by UUID."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None or not visible.strip():
        return index
    names = [v.strip() for v in visible.split(",")]
    if index >= len(names) or not names[index].isdigit():
        return None
    return int(names[index])


def page_memory(groups: dict[int, list[torch.Tensor]], layer_bytes: int, pages: int) -> PageMemory:
    """vLLM's memory (its per-layer views, by group) registered in place when the daemon can
    reach it, else staged."""
    where = placement(groups, layer_bytes, pages)
    why = "the layers' pages follow no one geometry"
    layers = [x for views in groups.values() for x in views]
    if where is not None and layers[0].is_cuda:
        try:
            memory: DeviceMemory | str = _on_device(groups, where)
        except Exception as e:  # torch refusing to share: staged, never a failed start
            memory = f"torch could not export the KV memory ({e})"
        if isinstance(memory, PageMemory):
            return memory
        why = memory
    elif where is not None:
        found = orbitkv.mapped.find(where.origin, where.span)
        if found is not None:
            return InPlaceMemory(groups, where, found)
        why = "the KV caches are not inside a host pool the package mapped"
    log.info("OrbitKV: KV pages staged through a host pool (%s)", why)
    return StagedMemory(groups, layer_bytes, pages)


def _on_device(groups: dict[int, list[torch.Tensor]], where: Placement) -> DeviceMemory | str:
    """A device pool over vLLM's CUDA allocation, or why there is none."""
    layers = [x for views in groups.values() for x in views]
    storage = layers[0].untyped_storage()
    if any(x.untyped_storage().data_ptr() != storage.data_ptr() for x in layers):
        return "the layers lie in several CUDA allocations"
    shared = storage._share_cuda_()  # type: ignore[attr-defined]
    handle = ipc_handle(bytes(shared[1]))
    if handle is None:
        return "the KV memory is an expandable segment, which no IPC handle opens"
    index = layers[0].device.index or 0
    device, gpu = daemon_ordinal(index), device_uuid(index)
    if device is None and gpu == bytes(16):
        return "CUDA_VISIBLE_DEVICES names devices by UUID, and torch gives none"
    offset = int(shared[3]) + where.origin - storage.data_ptr()
    return DeviceMemory(groups, where, -1 if device is None else device, handle, offset, gpu)
