"""An SGLang server rank on CPU made of SGLang's real parts: its server arguments published to
the runtime context, a device KV pool, the HiCache host pool in shared memory (`allocator: shm`)
and the storage backend `StorageBackendFactory` loads from `orbitkv.sglang` (the `dynamic`
backend), registered with the host pool as SGLang's cache controller does."""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orbitkv
import torch
from orbitkv.sglang import storage
from sglang.srt.distributed.utils import get_pp_indices
from sglang.srt.mem_cache.device_pool_info import MambaStateBufferInfo
from sglang.srt.mem_cache.hicache_storage import (
    HiCacheStorageConfig,
    HiCacheStorageExtraInfo,
    PoolName,
)
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, MLATokenToKVPool
from sglang.srt.mem_cache.pool_host.mamba import MambaPoolHost
from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost
from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost
from sglang.srt.mem_cache.storage import StorageBackendFactory
from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

PAGE = 16
LAYERS, HEADS, HEAD = 2, 2, 32
# An MLA model's latent and RoPE widths.
LORA, ROPE = 64, 16
# A hybrid model's Mamba state: its recurrent state per layer and its convolution state.
SSM_SHAPE, CONV_SHAPE, STATE_SLOTS = (2, 8, 16), (3, 64), 32


def model_variant(model: Path, into: Path, **config: object) -> Path:
    """A copy of the model directory `model` in `into`, its config.json changed by `config`."""
    shutil.copytree(model, into, dirs_exist_ok=True)
    path = into / "config.json"
    path.write_text(json.dumps(json.loads(path.read_text()) | config))
    return into


def same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Byte equality (KV bytes derived from hashes hold NaNs, which `torch.equal` tells apart)."""
    return a.shape == b.shape and bytes(a.contiguous().view(torch.uint8).numpy()) == bytes(
        b.contiguous().view(torch.uint8).numpy()
    )


def extra_config(socket: str, instance: str | None, **more: object) -> dict[str, object]:
    """The backend's extra config; without `instance`, SGLang's port and data-parallel rank
    name the instance."""
    config: dict[str, object] = {
        "backend_name": "orbitkv",
        "module_path": "orbitkv.sglang",
        "class_name": "OrbitKVStorage",
        "interface_v1": 1,
        "allocator": "shm",
        "hicache_storage_pass_prefix_keys": True,
        "socket": socket,
    }
    if instance is not None:
        config["instance"] = instance
    config.update(more)
    return config


@dataclass
class Rank:
    """One tensor-parallel rank of a server: its device and host pools and its backend."""

    model: Path
    instance: str | None
    socket: str
    layout: str = "page_first"
    # Host pool size as a multiple of the device pool's (SGLang's --hicache-ratio).
    ratio: float = 2.0
    dtype: str = "bfloat16"
    page: int = PAGE
    tp: int = 1
    tp_rank: int = 0
    # Pipeline stages, this rank's, and the model's layers (its config's `num_hidden_layers`):
    # each stage holds its part of them, as SGLang partitions them.
    pp: int = 1
    pp_rank: int = 0
    layers: int = LAYERS
    dp_rank: int = 0
    # SGLang's head groups of a page_unified host page.
    head_groups: int = 1
    # An MLA model (`model` a DeepSeek-V2 configuration): one latent row per token and layer.
    mla: bool = False
    # A hybrid model: a sliding-window host pool and a Mamba host pool beside the KV one,
    # registered as SGLang's hybrid cache controller registers them.
    hybrid: bool = False
    # SGLang's `--enable-hicache-storage-metrics`.
    metrics: bool = False
    args: dict[str, object] = field(default_factory=dict)
    extra: dict[str, object] = field(default_factory=dict)

    def __post_init__(self) -> None:
        extra = extra_config(self.socket, self.instance, **self.extra)
        server = ServerArgs(
            model_path=str(self.model),
            device="cpu",
            skip_tokenizer_init=True,
            page_size=self.page,
            dtype=self.dtype,
            tp_size=self.tp,
            pp_size=self.pp,
            enable_hierarchical_cache=True,
            hicache_mem_layout=self.layout,
            hicache_storage_backend="dynamic",
            hicache_storage_backend_extra_config=json.dumps(extra),
            **self.args,
        )
        set_global_server_args_for_scheduler(server)
        torch_dtype = getattr(torch, self.dtype)
        self.device, self.host = self._pools(torch_dtype, mla=self.mla)
        config = HiCacheStorageConfig(
            tp_rank=self.tp_rank,
            tp_size=self.tp,
            pp_rank=self.pp_rank,
            pp_size=self.pp,
            attn_cp_rank=0,
            attn_cp_size=1,
            is_mla_model=self.mla,
            enable_storage_metrics=self.metrics,
            is_page_first_layout=self.layout == "page_first",
            model_name=self.model.name,
            dp_rank=self.dp_rank,
            extra_config=dict(extra),
        )
        self.backend = StorageBackendFactory.create_backend("dynamic", config, self.host)
        self.backend.register_mem_pool_host(self.host)
        if self.hybrid:
            self.swa, self.mamba = self._sidecars(torch_dtype)
            self.backend.register_mem_host_pool_v2(self.host, PoolName.KV)
            self.backend.register_mem_host_pool_v2(self.swa, PoolName.SWA)
            self.backend.register_mem_host_pool_v2(self.mamba, PoolName.MAMBA)
        self.backend.on_host_pools_registered()

    def _pools(self, dtype: torch.dtype, mla: bool) -> tuple[Any, Any]:
        """A device KV pool of this rank's pipeline stage and its HiCache host pool in shared
        memory (MHA or MLA)."""
        start, end = get_pp_indices(self.layers, self.pp_rank, self.pp)
        device: Any
        if mla:
            device = MLATokenToKVPool(
                size=256,
                page_size=self.page,
                dtype=dtype,
                kv_lora_rank=LORA,
                qk_rope_head_dim=ROPE,
                layer_num=end - start,
                device="cpu",
                enable_memory_saver=False,
            )
        else:
            device = MHATokenToKVPool(
                size=256,
                page_size=self.page,
                dtype=dtype,
                head_num=HEADS // self.tp,
                head_dim=HEAD,
                layer_num=end - start,
                device="cpu",
                enable_memory_saver=False,
                enable_alt_stream=False,
                start_layer=start,
                end_layer=end - 1,
            )
        host_pool = MLATokenToKVPoolHost if mla else MHATokenToKVPoolHost
        extra_args: dict[str, object] = (
            {"target_layer_num": device.layer_num} if mla else {"head_group_num": self.head_groups}
        )
        host = host_pool(
            device.get_device_pool_infos()[0].buffer_info,
            self.ratio,
            0,
            self.page,
            self.layout,
            pin_memory=False,
            device="cpu",
            allocator_type="shm",
            device_capacity_tokens=device.size,
            start_layer=device.start_layer,
            end_layer=device.end_layer,
            **extra_args,
        )
        return device, host

    def _sidecars(self, dtype: torch.dtype) -> tuple[MHATokenToKVPoolHost, MambaPoolHost]:
        """A sliding-window host pool (SGLang's MHA host pool over a device pool of its own)
        and a Mamba host pool, both in shared memory."""
        _, swa = self._pools(dtype, mla=False)
        info = MambaStateBufferInfo(
            temporal=torch.zeros(LAYERS, STATE_SLOTS, *SSM_SHAPE, dtype=torch.float32),
            conv=(torch.zeros(LAYERS, STATE_SLOTS, *CONV_SHAPE, dtype=dtype),),
        )
        mamba = MambaPoolHost(
            info,
            self.ratio,
            0,
            device_capacity=STATE_SLOTS,
            pin_memory=False,
            device="cpu",
            allocator_type="shm",
            layout="page_first",
        )
        return swa, mamba

    def sealed(self, wait: float) -> bool:
        session = self.backend.session
        return session is not None and session.sealed(wait=wait) is not None

    def keys(self, tokens: list[int]) -> list[str]:
        """SGLang's page hashes of `tokens` (bit-exact with `get_hash_str`), hex."""
        return [h.hex() for h in orbitkv.sglang_page_hashes(tokens, self.page)]

    def alloc(self, pages: int) -> torch.Tensor:
        idx = self.host.alloc(pages * self.page)
        assert idx is not None, "host pool full"
        return idx

    def kv(self, idx: torch.Tensor) -> torch.Tensor:
        """The K and V of the token slots `idx`, every layer: `[2, layer, token, head, dim]`
        (MLA: the latent rows, `[layer, token, dim]`)."""
        h, kv = self.host, self.host.kv_buffer
        if self.mla:
            return self._mla_rows(idx).clone()
        if self.layout == "page_first":
            return kv[:, idx].permute(0, 2, 1, 3, 4).clone()
        if self.layout == "layer_first":
            return kv[:, :, idx].clone()
        pages = idx[:: self.page] // self.page
        if self.layout == "page_first_direct":  # [2, page, layer, token, head, dim]
            x = kv[:, pages].permute(0, 2, 1, 3, 4, 5)
        elif self.layout == "page_unified":  # [page, 1, layer, 2, token, head, dim]
            x = kv[pages].squeeze(1).permute(2, 1, 0, 3, 4, 5)
        else:  # page_head: [2, page, head, token, layer, dim]
            x = kv[:, pages].permute(0, 4, 1, 3, 2, 5)
        return x.reshape(2, h.layer_num, len(idx), h.head_num, h.head_dim).clone()

    def _mla_rows(self, idx: torch.Tensor, src: torch.Tensor | None = None) -> torch.Tensor:
        """The MLA rows of the slots `idx` as `[layer, token, dim]`; with `src`, written."""
        kv, layers = self.host.kv_buffer, self.host.layer_num
        if self.layout == "layer_first":  # [layer, slot, 1, dim]
            if src is not None:
                kv[:, idx] = src.unsqueeze(2)
            return kv[:, idx].squeeze(2)
        if self.layout == "page_first":  # [slot, layer, 1, dim]
            if src is not None:
                kv[idx] = src.permute(1, 0, 2).unsqueeze(2)
            return kv[idx].squeeze(2).permute(1, 0, 2)
        # page_first_direct: [page, layer, token, 1, dim]; page_unified: [page, layer, token, dim]
        pages = idx[:: self.page] // self.page
        if src is not None:
            x = src.view(layers, len(pages), self.page, -1).permute(1, 0, 2, 3)
            kv[pages] = x.view(kv[pages].shape)
        rows = kv[pages].reshape(len(pages), layers, self.page, -1)
        return rows.permute(1, 0, 2, 3).reshape(layers, len(idx), -1)

    def fill(self, idx: torch.Tensor, seed: bytes) -> torch.Tensor:
        """Writes bytes derived from `seed` into the slots `idx`; returns them as `kv` does."""
        h = self.host
        if self.mla:
            shape: tuple[int, ...] = (h.layer_num, len(idx), h.kv_cache_dim)
        else:
            shape = (2, h.layer_num, len(idx), h.head_num, h.head_dim)
        n = h.dtype.itemsize
        for d in shape:
            n *= d
        data = hashlib.shake_256(seed).digest(n)
        src = torch.frombuffer(bytearray(data), dtype=torch.uint8).view(h.dtype).view(shape)
        kv = h.kv_buffer
        if self.mla:
            self._mla_rows(idx, src)
        elif self.layout == "page_first":
            kv[:, idx] = src.permute(0, 2, 1, 3, 4)
        elif self.layout == "layer_first":
            kv[:, :, idx] = src
        else:
            pages = idx[:: self.page] // self.page
            x = src.view(2, h.layer_num, len(pages), self.page, h.head_num, h.head_dim)
            if self.layout == "page_first_direct":
                kv[:, pages] = x.permute(0, 2, 1, 3, 4, 5)
            elif self.layout == "page_unified":
                kv[pages] = x.permute(2, 1, 0, 3, 4, 5).unsqueeze(1)
            else:
                kv[:, pages] = x.permute(0, 2, 4, 3, 1, 5)
        return src.clone()

    def publish(self, tokens: list[int], seed: bytes = b"") -> tuple[list[str], torch.Tensor]:
        """Writes and stores every full page of `tokens` from the root: (keys, the bytes)."""
        keys = self.keys(tokens)
        idx = self.alloc(len(keys))
        data = self.fill(idx, seed + bytes(json.dumps(tokens[:4]), "ascii"))
        assert self.backend.batch_set_v1(keys, idx, HiCacheStorageExtraInfo(prefix_keys=[])) == [
            True
        ] * len(keys)
        self.host.free(idx)
        assert self.backend.wait_durable(10.0)
        return keys, data

    def exists(self, keys: list[str], prefix: list[str] | None = None) -> int:
        return int(self.backend.batch_exists(keys, HiCacheStorageExtraInfo(prefix_keys=prefix)))

    def get(
        self, keys: list[str], prefix: list[str] | None = None
    ) -> tuple[list[bool], torch.Tensor]:
        idx = self.alloc(len(keys))
        self.host.kv_buffer.zero_()
        done = self.backend.batch_get_v1(
            keys, idx, HiCacheStorageExtraInfo(prefix_keys=prefix or [])
        )
        out = self.kv(idx)
        self.host.free(idx)
        return done, out

    def close(self) -> None:
        self.backend.close()


def tensor_parallel(model: Path, name: str, socket: str, tp: int, **kw: object) -> list[Rank]:
    """The `tp` ranks of one server, registered together (as SGLang's rank processes start
    side by side), each sealed."""
    return _together([dict(tp=tp, tp_rank=r, **kw) for r in range(tp)], model, name, socket)


def pipeline(model: Path, name: str, socket: str, pp: int, layers: int) -> list[Rank]:
    """The `pp` stages of one server of a model of `layers` layers, registered together."""
    ranks: list[dict[str, object]] = [dict(pp=pp, pp_rank=r, layers=layers) for r in range(pp)]
    return _together(ranks, model, name, socket)


def _together(ranks: list[dict[str, object]], model: Path, name: str, socket: str) -> list[Rank]:
    wait, storage.SEAL_WAIT = storage.SEAL_WAIT, 0.0
    try:
        made = [Rank(model, name, socket, **kw) for kw in ranks]  # type: ignore[arg-type]
    finally:
        storage.SEAL_WAIT = wait
    assert all(r.sealed(wait=10.0) for r in made)
    return made
