"""What the connector reads from vLLM's configuration at start-up: the refusals (each one line
saying why and what to change), the identity inputs, the ranks, and the state format and layout
of a dense model's KV pages. Nothing here is read per block."""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import orbitkv
from orbitkv.naming import vllm_instance
from orbitkv.refusals import StartupRefused, refuse

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.kv_cache_interface import (
        FullAttentionSpec,
        KVCacheConfig,
        KVCacheGroupSpec,
        MambaSpec,
    )

# Bytes per element of each KV dtype vLLM names.
_ELEMENT_BYTES = {
    "float16": 2,
    "bfloat16": 2,
    "float32": 4,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "uint8": 1,
    "int8": 1,
}

# vLLM's block-internal orders: (token, head) order of a page, by KV cache layout. Layouts
# whose page of one layer is not one run (LHBNC, BHLNC) are refused.
_PAGE_ORDER = {"LBNHC": "NHD", "BLNHC": "NHD", "LBHNC": "HND", "BLHNC": "HND"}

# The accepted prefix-cache hashes and their hash domains.
_DOMAINS = {
    "sha256": "vllm/sha256",
    "sha256_cbor": "vllm/sha256_cbor",
    "xxhash_cbor": "vllm/xxhash_cbor",
}


def _refuse(why: str, change: str) -> StartupRefused:
    return refuse("OrbitKVConnector", why, change)


@dataclass(frozen=True)
class Settings:
    """The connector's view of one vLLM instance, resolved once at start-up."""

    instance: str
    socket: str | None
    model: str
    revision: str | None
    release: str
    dtype: str
    kv_cache_dtype: str
    quantization: str
    block_size: int
    hash_algo: str
    # A digest of the hash seed (the seed itself may need to stay secret).
    hash_seed: str
    hf_overrides: str
    tensor: int
    pipeline: int
    num_layers: int
    lora: bool
    producer: bool
    consumer: bool

    @property
    def workers(self) -> int:
        return self.tensor * self.pipeline

    @property
    def domain(self) -> str:
        return _DOMAINS[self.hash_algo]

    def rank(self, tp_rank: int, pp_rank: int) -> int:
        """A worker's rank: pp_rank · tp + tp_rank."""
        return pp_rank * self.tensor + tp_rank

    def stage_layers(self, rank: int) -> int:
        """Layers of the pipeline stage `rank` belongs to (vLLM's own split)."""
        from vllm.distributed.utils import get_pp_indices

        start, end = get_pp_indices(self.num_layers, rank // self.tensor, self.pipeline)
        return int(end - start)


def _dtype_name(dtype: object) -> str:
    return str(dtype).removeprefix("torch.")


def settings_from(vllm_config: VllmConfig) -> Settings:
    """The instance's settings, or `StartupRefused` for a configuration it cannot serve."""
    import vllm

    kvt = vllm_config.kv_transfer_config
    model, cache, parallel = (
        vllm_config.model_config,
        vllm_config.cache_config,
        vllm_config.parallel_config,
    )
    if kvt.kv_load_failure_policy != "recompute":
        raise _refuse(
            f"kv_load_failure_policy is {kvt.kv_load_failure_policy!r}: a failed load would end "
            "the request",
            'set "kv_load_failure_policy": "recompute" in --kv-transfer-config',
        )
    algo = cache.prefix_caching_hash_algo
    seed = os.environ.get("PYTHONHASHSEED")
    if algo == "xxhash":
        raise _refuse(
            "the prefix-cache hash xxhash has no hash domain OrbitKV can key records under",
            "use --prefix-caching-hash-algo sha256 (the default), sha256_cbor, or xxhash_cbor "
            "with PYTHONHASHSEED set",
        )
    if algo == "xxhash_cbor" and seed is None:
        raise _refuse(
            "xxhash_cbor without PYTHONHASHSEED hashes blocks with a random per-process seed",
            "set PYTHONHASHSEED to the same value on every instance that shares records",
        )
    if algo not in _DOMAINS:
        raise _refuse(f"the prefix-cache hash {algo!r} is not mapped", "use sha256")
    if model.enable_sleep_mode:
        raise _refuse(
            "sleep mode allocates KV memory that cannot be exported to the daemon",
            "start vLLM without --enable-sleep-mode",
        )
    if "expandable_segments:True" in os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""):
        raise _refuse(
            "expandable_segments allocates KV memory that cannot be exported to the daemon",
            "unset expandable_segments:True in PYTORCH_CUDA_ALLOC_CONF",
        )
    if parallel.nnodes_within_dp > 1:
        raise _refuse(
            "the tensor/pipeline-parallel group spans nodes; the daemon serves one node",
            "run each node's ranks as their own instance",
        )
    if parallel.decode_context_parallel_size > 1 or parallel.prefill_context_parallel_size > 1:
        raise _refuse(
            "context parallelism shards a block's tokens across ranks, which is not mapped yet",
            "set --decode-context-parallel-size 1 and --prefill-context-parallel-size 1",
        )
    extra = kvt.kv_connector_extra_config or {}
    socket = extra.get("socket")
    if socket is not None and not isinstance(socket, str):
        raise _refuse(f"kv_connector_extra_config.socket is {socket!r}", "give a path")
    hf_config = model.hf_config
    num_layers = int(getattr(hf_config, "num_hidden_layers", 0))
    seed_text = seed if seed is not None else "vllm-none-hash"
    return Settings(
        instance=vllm_instance(str(kvt.engine_id)),
        socket=socket,
        model=str(model.model),
        revision=model.revision,
        release=vllm.__version__,
        dtype=_dtype_name(model.dtype),
        kv_cache_dtype=str(cache.cache_dtype),
        quantization=str(model.quantization or "none"),
        block_size=int(cache.block_size),
        hash_algo=algo,
        hash_seed=hashlib.sha256(seed_text.encode()).hexdigest(),
        hf_overrides=json.dumps(model.hf_overrides, sort_keys=True, default=str)
        if isinstance(model.hf_overrides, dict)
        else repr(model.hf_overrides),
        tensor=int(parallel.tensor_parallel_size),
        pipeline=int(parallel.pipeline_parallel_size),
        num_layers=num_layers,
        lora=vllm_config.lora_config is not None,
        producer=bool(kvt.is_kv_producer),
        consumer=bool(kvt.is_kv_consumer),
    )


@dataclass(frozen=True)
class PageShape:
    """One KV cache group's page per layer: its spec's shape and byte order, the group's kind
    and its layers. The daemon keys the group under vLLM's group index."""

    block_size: int
    kv_heads: int
    head_size: int
    head_size_v: int
    kv_dtype: str
    order: str  # "NHD" or "HND"
    group: int = 0
    # "full" (attention over the whole prefix), "mla" (one latent row per token, the same on
    # every TP rank), "window" (attention over the last `window` tokens) or "mamba" (a
    # recurrent state per block boundary, in `mamba_cache_mode="align"`).
    kind: str = "full"
    window: int = 0
    layer_names: tuple[str, ...] = ()
    # A Mamba page: its states' bytes (conv, then SSM, packed) and the page they are padded
    # to (the attention page), and the states' shapes and dtypes.
    state_bytes: int = 0
    padded_bytes: int = 0
    states: str = ""

    @property
    def element(self) -> int:
        return _ELEMENT_BYTES.get(self.kv_dtype, 0)

    @property
    def element_known(self) -> bool:
        return self.kv_dtype in _ELEMENT_BYTES

    @property
    def layer_bytes(self) -> int:
        """A layer's page: its heads' elements, or a Mamba page with its padding."""
        if self.kind == "mamba":
            return self.padded_bytes
        return self.block_size * self.kv_heads * (self.head_size + self.head_size_v) * self.element

    @property
    def component(self) -> str:
        kinds = {"full": "dense_kv", "mla": "mla", "window": "sliding_window_kv"}
        return kinds.get(self.kind, "ssm_state")

    @property
    def rule(self) -> tuple[str, int]:
        """The group's recovery rule. vLLM resumes a window group with the blocks covering the
        last W - 1 tokens before the boundary, which is the daemon's `window(W)`; a Mamba group
        from the state at exactly the boundary, a block's end."""
        if self.kind == "window":
            return ("window", self.window)
        if self.kind == "mamba":
            return ("checkpoint", self.block_size)
        return ("prefix", 0)


def _group_kind(spec: object) -> str | None:
    """The kind of a group's spec, by exact class (a subclass may change the bytes)."""
    from vllm.v1.kv_cache_interface import (
        FullAttentionSpec,
        MambaSpec,
        MLAAttentionSpec,
        SlidingWindowSpec,
    )

    kind = {
        FullAttentionSpec: "full",
        MLAAttentionSpec: "mla",
        SlidingWindowSpec: "window",
        MambaSpec: "mamba",
    }
    return kind.get(type(spec))  # type: ignore[call-overload]


# The kinds of groups mapped beside full attention (MLA is mapped alone).
_BESIDE_FULL = {"window", "mamba"}


def kv_groups(
    kv_cache_config: KVCacheConfig | None, layout: str | None, pipeline: int = 1
) -> tuple[PageShape, ...]:
    """Every KV cache group's page shape, or `StartupRefused` naming the first group that is
    not mapped: full attention, MLA alone, and full attention beside sliding windows are."""
    if kv_cache_config is None:
        raise _refuse("vLLM gave no KV cache configuration", "use vLLM 0.33 or newer")
    name = layout or "LBNHC"
    if name not in _PAGE_ORDER:
        raise _refuse(
            f"the KV cache layout {name} puts a page of one layer in several runs, which the "
            "pool geometry does not describe",
            "use the default layout (unset VLLM_KV_CACHE_LAYOUT)",
        )
    shapes = tuple(
        _group_shape(i, g, _PAGE_ORDER[name]) for i, g in enumerate(kv_cache_config.kv_cache_groups)
    )
    kinds = sorted({s.kind for s in shapes})
    alone = kinds == ["full"] or (kinds == ["mla"] and len(shapes) == 1)
    if not alone and not ("full" in kinds and set(kinds) - {"full"} <= _BESIDE_FULL):
        raise _refuse(
            f"KV cache groups of kinds {kinds} together are not mapped yet",
            "use a dense or MLA model, or full attention beside sliding windows or Mamba "
            "layers, or run without the connector",
        )
    if pipeline > 1 and kinds != ["full"]:
        raise _refuse(
            f"KV cache groups of kinds {kinds} under pipeline parallelism are not mapped yet "
            "(each stage holds its own layers of each group)",
            "run with --pipeline-parallel-size 1",
        )
    if len({(s.block_size, s.layer_bytes) for s in shapes}) != 1:
        raise _refuse(
            "the KV cache groups differ in block size or page size",
            "use one block size for every group",
        )
    return shapes


def _group_shape(index: int, group: KVCacheGroupSpec, order: str) -> PageShape:
    """Group `index`'s page shape, or `StartupRefused` naming the group's kind."""
    spec = group.kv_cache_spec
    kind = _group_kind(spec)
    what = f"KV cache group {index} ({type(spec).__name__}, layers {group.layer_names[:2]}...)"
    if kind is None:
        raise _refuse(f"{what} is not a state OrbitKV can restore", _NO_CONNECTOR)
    if group.is_eagle_group:
        raise _refuse(f"{what} holds a speculative draft model's layers", _NO_DRAFT)
    if group.host_resident or not group.enable_kv_transfer or str(group.role.value) != "default":
        raise _refuse(f"{what} is not transferable device KV", _NO_CONNECTOR)
    if kind == "mamba":
        return _mamba_shape(index, group, order, what)
    full = cast("FullAttentionSpec", spec)
    if kind != "window" and (full.sliding_window is not None or full.attention_chunk_size):
        raise _refuse(
            f"{what} computes windowed attention over full-attention blocks",
            "leave the hybrid KV cache manager on (unset --disable-hybrid-kv-cache-manager)",
        )
    window = int(getattr(spec, "sliding_window", 0) or 0)
    if kind == "window" and int(getattr(spec, "extra_retained_tokens", 0)):
        raise _refuse(f"{what} retains extra blocks for speculative decoding", _NO_DRAFT)
    if str(getattr(getattr(spec, "cache_role", None), "value", "")) == "indexer":
        raise _refuse(f"{what} is a sparse-attention (DSA) indexer cache", _NO_CONNECTOR)
    if kind == "mla" and (
        getattr(spec, "model_version", None) is not None
        or getattr(spec, "topk_buffer_width", None) is not None
        or str(getattr(spec, "cache_dtype_str", None) or "auto") not in ("auto", "bfloat16", "fp8")
    ):
        raise _refuse(f"{what} is a sparse or packed MLA cache, not mapped yet", _NO_CONNECTOR)
    shape = PageShape(
        block_size=int(spec.block_size),
        kv_heads=int(full.num_kv_heads),
        head_size=int(full.head_size),
        head_size_v=int(full.head_size_v),
        kv_dtype=_dtype_name(full.dtype),
        order=order,
        group=index,
        kind=kind,
        window=window,
        layer_names=tuple(group.layer_names),
    )
    # Only the heads' elements are mapped: not a page with more (padding, packed head slots),
    # nor a quantization mode with scales of its own (per token and head, block-wise). fp8 with
    # one scale per tensor is mapped: the scale is the checkpoint's, part of the model's content.
    mode = str(getattr(getattr(spec, "kv_quant_mode", None), "name", "NONE"))
    if (
        not shape.element_known
        or spec.page_size_bytes != shape.layer_bytes
        or getattr(spec, "num_head_slots", None) is not None
        or getattr(spec, "tokens_per_state", 1) != 1
        or mode not in ("NONE", "FP8_PER_TENSOR")
    ):
        raise _refuse(
            f"a KV page of {spec.page_size_bytes} bytes in {what} is not {shape.kv_heads} heads "
            f"of {shape.block_size} tokens in {shape.kv_dtype} (padding, scales or a KV "
            "quantization mode not mapped yet)",
            "use --kv-cache-dtype auto",
        )
    return shape


def _mamba_shape(index: int, group: KVCacheGroupSpec, order: str, what: str) -> PageShape:
    """A Mamba group in `align` mode: each block boundary's state in its own block, one page
    per layer (the conv and SSM states packed, padded to the attention page)."""
    spec = cast("MambaSpec", group.kv_cache_spec)
    if spec.mamba_cache_mode != "align":
        raise _refuse(
            f"{what} keeps its state in cache mode {spec.mamba_cache_mode!r}, not at block "
            "boundaries",
            "enable prefix caching (vLLM then uses mamba_cache_mode 'align')",
        )
    if spec.num_speculative_blocks or spec.num_prefill_checkpoint_blocks:
        raise _refuse(
            f"{what} keeps speculative or prefill-checkpoint state blocks, not mapped yet",
            _NO_DRAFT,
        )
    if spec.tp_replicated:
        raise _refuse(f"{what} is replicated across TP ranks, not mapped yet", _NO_CONNECTOR)
    content = sum(
        math.prod(shape) * _ELEMENT_BYTES.get(_dtype_name(dtype), 0)
        for shape, dtype in zip(spec.shapes, spec.dtypes, strict=True)
    )
    if content != spec.state_content_size_bytes or content > spec.page_size_bytes:
        raise _refuse(f"{what} holds a state dtype not mapped yet", _NO_CONNECTOR)
    return PageShape(
        block_size=int(spec.block_size),
        kv_heads=1,
        head_size=content,
        head_size_v=0,
        kv_dtype="uint8",
        order=order,
        group=index,
        kind="mamba",
        layer_names=tuple(group.layer_names),
        state_bytes=content,
        padded_bytes=int(spec.page_size_bytes),
        states=";".join(
            f"{'x'.join(map(str, shape))}:{_dtype_name(dtype)}"
            for shape, dtype in zip(spec.shapes, spec.dtypes, strict=True)
        ),
    )


_NO_CONNECTOR = "run this model without the connector"
_NO_DRAFT = "run without speculative decoding, or without the connector"


def group_layers(s: Settings, shape: PageShape, rank: int) -> int:
    """The layers of `shape`'s group at `rank`: its stage's (pipeline parallelism maps one
    group only), else the group's own."""
    return s.stage_layers(rank) if s.pipeline > 1 else len(shape.layer_names) or s.num_layers


def record_rank(shape: PageShape, rank: int) -> int:
    """The rank a group's records are stored under at `rank`: its own, or MLA's one copy's."""
    return orbitkv.RANK_REPLICATED if shape.kind == "mla" else rank


def state_format(
    s: Settings, shape: PageShape, rank: int, attention_backend: str
) -> orbitkv.StateFormat:
    """The bytes of one record at `rank`: every layer of its stage, each layer's page in vLLM's
    own byte order (NHD: token, head, then the K and V halves of the head's row; MLA: token,
    then the latent row)."""
    e, n, h = shape.element, shape.block_size, shape.kv_heads
    layers = group_layers(s, shape, rank)
    axes: list[tuple[Any, int, int]] = [("layer", layers, shape.layer_bytes)]
    if shape.kind == "mamba":
        # A layer's page as bytes: its states packed (`states` says their shapes and dtypes),
        # then the padding.
        axes += [("state", shape.layer_bytes, 1)]
    elif shape.kind == "mla":
        axes += [("token", n, shape.head_size * e), ("head_dim", shape.head_size, e)]
    else:
        row = (shape.head_size + shape.head_size_v) * e
        token, head = (h * row, row) if shape.order == "NHD" else (row, n * row)
        inner = [("token", n, token), ("kv_head", h, head)]
        axes += inner if shape.order == "NHD" else inner[::-1]
        axes += [("kv_split", 2, shape.head_size * e), ("head_dim", shape.head_size, e)]
    return orbitkv.StateFormat(
        dtype=shape.states or s.dtype,
        kv_quant=s.kv_cache_dtype,
        block_tokens=shape.block_size,
        layers=layers,
        layout=axes,
        kv_heads=h,
        head_size_k=shape.head_size,
        head_size_v=shape.head_size_v,
        engine="vllm",
        release=s.release,
        attention_backend=attention_backend,
        rank="replicated" if shape.kind == "mla" else rank,
        tensor=s.tensor,
        pipeline=s.pipeline,
    )


def storage_layout(
    s: Settings, shapes: tuple[PageShape, ...], attention_backend: str
) -> orbitkv.StorageLayout:
    """The instance's layout: a group per vLLM KV cache group, one format per rank each (one
    for all, MLA's)."""
    groups = [
        orbitkv.CacheGroup(
            id=shape.group,
            component=shape.component,
            block_tokens=shape.block_size,
            page_bytes=shape.layer_bytes * group_layers(s, shape, 0),
            formats=[
                state_format(s, shape, r, attention_backend)
                for r in range(1 if shape.kind == "mla" else s.workers)
            ],
        )
        for shape in shapes
    ]
    return orbitkv.StorageLayout(groups, tensor=s.tensor, pipeline=s.pipeline)


def rules(shapes: tuple[PageShape, ...]) -> tuple[tuple[int, str, int], ...]:
    """Each group's recovery rule, for the registration."""
    return tuple((shape.group, *shape.rule) for shape in shapes)


def identity(
    s: Settings, shapes: tuple[PageShape, ...], attention_backend: str
) -> orbitkv.Identity:
    """The computation's identity: the model by content and every setting that changes the KV
    bytes; the placement is not part of it."""
    return orbitkv.resolve_identity(
        s.model,
        engine="vllm",
        release=s.release,
        dtype=s.dtype,
        kv_cache_dtype=s.kv_cache_dtype,
        quantization=s.quantization,
        attention_backend=attention_backend,
        cache_variant="full_attention",
        settings=[
            ("block_size", str(s.block_size).encode()),
            ("page_order", shapes[0].order.encode()),
            ("hash", f"{s.hash_algo}:{s.hash_seed}".encode()),
            ("hf_overrides", s.hf_overrides.encode()),
            ("parallel", f"tp{s.tensor}pp{s.pipeline}".encode()),
        ],
        revision=s.revision,
    )
