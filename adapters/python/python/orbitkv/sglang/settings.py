"""What the backend reads from SGLang at start-up: the refusals (each one line saying why and
what to change), the identity inputs, the rank, and the state format and pool geometry of the
host pool's pages. Nothing here is read per page."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import orbitkv
from orbitkv import weights
from orbitkv.naming import sglang_instance
from orbitkv.refusals import StartupRefused, refuse

if TYPE_CHECKING:
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig
    from sglang.srt.mem_cache.pool_host.base import HostKVCache
    from sglang.srt.mem_cache.pool_host.mamba import MambaPoolHost

# The group OrbitKV keys an MHA model's KV pages under, and the pool's id.
GROUP = 0
POOL = 1
DOMAIN = "sglang/sha256"
# A hybrid model's host pools beside the KV one: the sliding-window pool, then the Mamba
# pool's state buffers (its recurrent state, then each convolution state), a group and a pool
# each.
SWA_GROUP, SWA_POOL = 1, 2
STATE_GROUP, STATE_POOL = 2, 3

# Host layouts mapped: the order of a record's axes (outermost first) and whether every layer
# lies inside one run of a page. MHA pages hold K and V apart (`kv_split`); an MLA page holds
# one latent row per token and layer (`head_dim`: the latent and its RoPE part).
_RECORD_ORDER = {
    "page_first": (("kv_split", "token", "layer", "kv_head", "head_dim"), True),
    "page_head": (("kv_split", "kv_head", "token", "layer", "head_dim"), True),
    "layer_first": (("layer", "kv_split", "token", "kv_head", "head_dim"), False),
    "page_first_direct": (("layer", "kv_split", "token", "kv_head", "head_dim"), False),
    "page_unified": (("layer", "kv_split", "token", "kv_head", "head_dim"), False),
}
_MLA_RECORD_ORDER = {
    "page_first": (("token", "layer", "head_dim"), True),
    "layer_first": (("layer", "token", "head_dim"), False),
    "page_first_direct": (("layer", "token", "head_dim"), False),
    "page_unified": (("layer", "token", "head_dim"), False),
}


# The host pool classes mapped, and whether each is MLA's (exact classes: a subclass such as the
# MXFP8 pool keeps scales beside the pages).
_HOST_POOLS = {"MHATokenToKVPoolHost": False, "MLATokenToKVPoolHost": True}


def _refuse(why: str, change: str) -> StartupRefused:
    return refuse("OrbitKVStorage", why, change)


@dataclass(frozen=True)
class Settings:
    """The backend's view of one SGLang server rank, resolved once at start-up."""

    instance: str
    socket: str | None
    model: str
    revision: str | None
    release: str
    dtype: str
    kv_cache_dtype: str
    quantization: str
    attention_backend: str
    page_size: int
    overrides: str
    weight_version: str
    tensor: int
    pipeline: int
    tp_rank: int
    pp_rank: int
    # An MLA model: one copy of each page for every TP rank, published by the storage writer.
    mla: bool
    writer: bool
    # With pipeline parallelism, each stage's layer count (SGLang's own partition).
    stage_layers: tuple[int, ...] = ()

    @property
    def workers(self) -> int:
        return self.tensor * self.pipeline

    @property
    def rank(self) -> int:
        """This rank: pp_rank · tp + tp_rank."""
        return self.pp_rank * self.tensor + self.tp_rank


# The scheduler's methods that change weights in place (a weight version is recorded only when
# the caller names one).
WEIGHT_UPDATES = (
    "update_weights_from_disk",
    "update_weights_from_distributed",
    "update_weights_from_tensor",
    "update_weights_from_ipc",
)
# The model runner's methods that load the new weights. The scheduler's request dispatcher binds
# the scheduler's methods once, so a backend attached later cannot wrap those calls; these are
# looked up on each call.
RUNNER_WEIGHT_UPDATES = (
    "update_weights_from_disk",
    "update_weights_from_tensor",
    "update_weights_from_ipc",
    "receive_weights_from_distributed",
    "load_weights_from_distributed",
    "begin_weight_update",
)


def watch_weight_updates() -> None:
    """Wraps SGLang's weight updates, the scheduler's and the model runner's: a call stops
    serving (`orbitkv.weights`)."""
    from sglang.srt.managers.scheduler_components.weight_updater import (
        SchedulerWeightUpdaterManager,
    )
    from sglang.srt.model_executor.model_runner_components.weight_updater import WeightUpdater

    weights.watch(SchedulerWeightUpdaterManager, WEIGHT_UPDATES)
    weights.watch(WeightUpdater, RUNNER_WEIGHT_UPDATES)


def _dp_rank(config: HiCacheStorageConfig) -> int:
    """This server's data-parallel rank: the storage config's (dp-attention), else the runtime
    context's (plain data parallelism gives every rank's storage config 0)."""
    if config.dp_rank:
        return int(config.dp_rank)
    from sglang.srt.runtime_context import get_parallel

    try:
        return int(get_parallel().dp_rank or 0)
    except Exception:  # not published: one data-parallel rank
        return 0


def hybrid_refusal(pool: str, why: str = "is not mapped yet") -> StartupRefused:
    return _refuse(
        f"the host pool {pool!r} beside the KV pages {why}",
        "run the model without the OrbitKV backend",
    )


def weight_version() -> str:
    """The weight version SGLang's runtime context holds now."""
    from sglang.srt.runtime_context import get_serving

    return str(get_serving().weight_version)


def settings_from(config: HiCacheStorageConfig) -> Settings:
    """The rank's settings, or `StartupRefused` for a configuration it cannot serve."""
    from sglang.srt.runtime_context import (
        get_exec,
        get_memory,
        get_model,
        get_schedule,
        get_serving,
    )
    from sglang.version import __version__

    extra: dict[str, Any] = dict(config.extra_config or {})
    raw = get_memory().hicache_storage_backend_extra_config
    passed = json.loads(raw) if isinstance(raw, str) and raw else {}
    if not passed.get("hicache_storage_pass_prefix_keys"):
        raise _refuse(
            "SGLang does not pass the page hashes before a call's keys, without which a page's "
            "token position is unknown",
            'add "hicache_storage_pass_prefix_keys": true to '
            "--hicache-storage-backend-extra-config",
        )
    if int(extra.get("interface_v1", 0)) != 1:
        raise _refuse(
            "the v1 storage calls (zero-copy host pages) are not selected",
            'add "interface_v1": 1 to --hicache-storage-backend-extra-config',
        )
    if config.pp_size > 1 and config.is_mla_model:
        raise _refuse(
            "pipeline parallelism with MLA is not mapped yet (one copy for every rank would "
            "need a layer count per stage)",
            "run with --pp-size 1, or without the OrbitKV backend",
        )
    if config.attn_cp_size > 1 or config.dcp_size > 1:
        raise _refuse(
            "context parallelism shards a page's tokens across ranks, which is not mapped yet",
            "run without attention context parallelism",
        )
    socket = extra.get("socket")
    if socket is not None and not isinstance(socket, str):
        raise _refuse(f"extra config `socket` is {socket!r}", "give a path")
    model = get_model()
    port = int(getattr(get_serving(), "port", 0) or 0)
    return Settings(
        instance=sglang_instance(extra, port, _dp_rank(config)),
        socket=socket,
        model=str(model.model_path),
        revision=model.revision,
        release=str(__version__),
        dtype=str(model.dtype).removeprefix("torch."),
        kv_cache_dtype=str(model.kv_cache_dtype),
        quantization=str(model.quantization or "none"),
        attention_backend=str(get_exec().kernel.attention_backend),
        page_size=int(get_schedule().page_size),
        overrides=str(model.json_model_override_args or "{}"),
        weight_version=weight_version(),
        tensor=int(config.tp_size),
        pipeline=int(config.pp_size),
        tp_rank=int(config.tp_rank),
        pp_rank=int(config.pp_rank),
        mla=bool(config.is_mla_model),
        writer=bool(config.is_storage_writer),
        stage_layers=_stage_layers(int(config.pp_size)),
    )


def _stage_layers(stages: int) -> tuple[int, ...]:
    """Each pipeline stage's layer count, as SGLang partitions the model's layers (its own
    function, `SGLANG_PP_LAYER_PARTITION` included); none without pipeline parallelism."""
    if stages == 1:
        return ()
    from sglang.srt.distributed.utils import get_pp_indices
    from sglang.srt.runtime_context import process_model_config

    try:
        layers = int(process_model_config().num_hidden_layers)
        bounds = [get_pp_indices(layers, stage, stages) for stage in range(stages)]
    except Exception as e:
        raise _refuse(
            f"the layers of each pipeline stage cannot be known ({e})",
            "run with --pp-size 1, or without the OrbitKV backend",
        ) from e
    return tuple(end - start for start, end in bounds)


def check_stage(s: Settings, pages: HostPages) -> None:
    """`StartupRefused` when the host pool does not hold this rank's stage's layers."""
    if s.stage_layers and pages.layers != s.stage_layers[s.pp_rank]:
        raise _refuse(
            f"the host pool holds {pages.layers} layers; pipeline stage {s.pp_rank} has "
            f"{s.stage_layers[s.pp_rank]} of {sum(s.stage_layers)}",
            "report this configuration: SGLang partitioned the layers another way",
        )


def stage_pages(pages: HostPages, layers: int) -> HostPages:
    """`pages` as they are on a pipeline stage of `layers` layers (another rank's record)."""
    if layers == pages.layers:
        return pages
    counts = {name: count for name, count, _ in pages.axes} | {"layer": layers}
    axes = _axes(tuple(name for name, _, _ in pages.axes), counts, pages.axes[-1][2])
    page_bytes = pages.page_bytes // pages.layers * layers
    return dataclasses.replace(pages, layers=layers, axes=axes, page_bytes=page_bytes)


@dataclass(frozen=True)
class HostPages:
    """The host pool's pages as the daemon reaches them: the memfd, the geometry of its KV
    pages from the memfd's byte 0, and the record's byte order."""

    fd: int
    spec: orbitkv.PoolSpec
    layers: int
    layout: str
    axes: list[tuple[Any, int, int]]
    kv_heads: int
    head_size_k: int
    head_size_v: int
    dtype: str
    page_bytes: int
    mla: bool
    # The group and pool ids, what the group holds and its recovery rule.
    group: int = GROUP
    pool: int = POOL
    component: str = "dense_kv"
    rule: tuple[str, int] = ("prefix", 0)
    # Token slots of the host pool per page (a Mamba pool has one slot per state).
    slots_per_page: int = 0
    # The quantization of the bytes ("none": a state buffer in its own dtype).
    quant: str | None = None


def host_pages(host: HostKVCache, group: int = GROUP, pool: int = POOL) -> HostPages:
    """The geometry of an MHA or MLA host pool's pages, or `StartupRefused`."""
    kind = type(host).__name__
    if kind not in _HOST_POOLS:
        raise _refuse(
            f"the host pool {kind} is not mapped (its pages have parts this backend does not "
            "store)",
            "use bf16/fp16 or fp8 KV without separate scales, or run without the OrbitKV backend",
        )
    layout = str(host.layout)
    mla = _HOST_POOLS[kind]
    orders = _MLA_RECORD_ORDER if mla else _RECORD_ORDER
    if layout not in orders:
        raise _refuse(
            f"the host layout {layout} is not mapped{' for MLA' if mla else ''}",
            f"use --hicache-mem-layout {', '.join(orders)} (page_first is the default)",
        )
    fd = getattr(getattr(host, "allocator", None), "fd", None)
    if not isinstance(fd, int):
        raise _refuse(
            "the host pool is not shared memory the daemon can map",
            'add "allocator": "shm" to --hicache-storage-backend-extra-config',
        )
    kv = host.kv_buffer
    unified = layout == "page_unified"
    if unified and int(getattr(host, "head_group_num", 1)) != 1:
        raise _refuse(
            "page_unified with several head groups interleaves K and V by group",
            "use --hicache-mem-layout page_first",
        )
    if not kv.is_contiguous() or (not mla and not unified and kv.shape[0] != 2):
        raise _refuse(f"a host KV buffer of shape {tuple(kv.shape)} is not mapped", "use MHA")
    e = kv.element_size()
    layers, ps, slots = int(host.layer_num), int(host.page_size), int(host.size)
    if mla:
        heads, dk, dv, parts = 1, int(host.kv_cache_dim), 0, 1
        width = dk
    else:
        heads, dk, dv = int(host.head_num), int(host.head_dim), int(host.v_head_dim)
        if dk != dv:
            raise _refuse("K and V heads of different sizes are not mapped yet", "use MHA")
        parts, width = 2, heads * dk
    run = ps * width * e  # one layer's part (K, V or the latent) of one page
    # K and V: the two halves of the buffer, or (page_unified) side by side in a layer.
    part_stride = 0 if mla else run if unified else kv[0].numel() * e
    order, inside = orders[layout]
    if inside:
        page_stride, layer_stride = layers * run, 0
    elif layout == "layer_first":
        page_stride, layer_stride = run, slots * width * e
    elif unified:  # a page's layers in turn, each its K then its V
        page_stride, layer_stride = parts * layers * run, parts * run
    else:  # page_first_direct: a page's layers in turn, K and V in the buffer's two halves
        page_stride, layer_stride = layers * run, run
    geometry = orbitkv.GroupGeometry(
        group=group,
        layers=layers,
        offset=0,
        page_stride=page_stride,
        layer_stride=layer_stride,
        layer_bytes=parts * run,
        parts=parts,
        part_stride=part_stride,
        layers_inside=inside,
    )
    page_bytes = parts * layers * run
    spec = orbitkv.PoolSpec(pool=pool, page_bytes=page_bytes, pages=slots // ps, groups=[geometry])
    counts = {"kv_split": 2, "token": ps, "layer": layers, "kv_head": heads, "head_dim": dk}
    return HostPages(
        fd=fd,
        spec=spec,
        layers=layers,
        layout=layout,
        axes=_axes(order, counts, e),
        kv_heads=heads,
        head_size_k=dk,
        head_size_v=dv,
        dtype=str(kv.dtype).removeprefix("torch."),
        page_bytes=page_bytes,
        mla=mla,
        group=group,
        pool=pool,
        component="mla" if mla else "dense_kv",
        slots_per_page=ps,
    )


def sidecar_pages(name: str, host: HostKVCache, s: Settings) -> list[HostPages]:
    """The groups of a hybrid model's host pool beside the KV one (`name` is SGLang's pool
    name), or `StartupRefused`: a sliding-window pool is one group under the model's window; a
    Mamba pool is one group per state buffer, each resumed from its checkpoint at a page
    boundary. Any other pool is refused."""
    kind = type(host).__name__
    if s.mla:
        raise hybrid_refusal(name, "of an MLA model is not mapped yet")
    if s.pipeline > 1:
        raise hybrid_refusal(name, "with pipeline parallelism is not mapped yet")
    if name == "swa" and kind == "MHATokenToKVPoolHost":
        window = swa_window(s)
        pages = host_pages(host, SWA_GROUP, SWA_POOL)
        if int(host.page_size) != s.page_size:
            raise hybrid_refusal(name, f"has {host.page_size} tokens a page, not {s.page_size}")
        # SGLang restores a window only with all of its ceil(W / page) trailing pages loaded:
        # the rule asks for those pages (a window of that many pages and one token).
        rule = ("window", -(-window // s.page_size) * s.page_size + 1)
        return [dataclasses.replace(pages, component="sliding_window_kv", rule=rule)]
    if name == "mamba" and kind == "MambaPoolHost":
        return _state_pages(cast("MambaPoolHost", host), s)
    raise hybrid_refusal(name, f"({kind}) is not mapped")


def _state_pages(host: MambaPoolHost, s: Settings) -> list[HostPages]:
    """One group per state buffer of SGLang's Mamba host pool: a slot of each buffer holds every
    layer's state, contiguous (layouts `page_first` and `page_first_direct`)."""
    if str(host.layout) not in ("page_first", "page_first_direct"):
        raise hybrid_refusal("mamba", f"in layout {host.layout} is not mapped")
    if host.slot_state_buffers or host.mtp_draft_buffer_infos:
        raise hybrid_refusal("mamba", "holds side or draft states, which are not mapped")
    # The recurrent state, absent (and not in shared memory) for a convolution-only model, then
    # each convolution state: the allocator's memfds in the same order.
    states = [(host.temporal_buffer, "ssm_state")] * (host.temporal_buffer.numel() > 0)
    states += [(b, "conv_state") for b in host.conv_buffer]
    buffers = [b for b, _ in states]
    fds = list(getattr(getattr(host, "allocator", None), "fds", None) or [])
    if len(fds) != len(buffers):
        raise _refuse(
            "the Mamba host pool is not shared memory the daemon can map",
            'add "allocator": "shm" to --hicache-storage-backend-extra-config',
        )
    slots = int(host.size)
    groups = []
    for i, ((buffer, component), fd) in enumerate(zip(states, fds, strict=True)):
        if not buffer.is_contiguous() or int(buffer.shape[0]) != slots:
            raise hybrid_refusal("mamba", f"buffer of shape {tuple(buffer.shape)} is not mapped")
        layers = int(buffer.shape[1])
        state = tuple(int(d) for d in buffer.shape[3:])
        e = buffer.element_size()
        run = math.prod(state) * e  # one layer's state in a slot
        geometry = orbitkv.GroupGeometry(
            group=STATE_GROUP + i,
            layers=layers,
            offset=0,
            page_stride=layers * run,
            layer_stride=run,
            layer_bytes=run,
        )
        spec = orbitkv.PoolSpec(
            pool=STATE_POOL + i, page_bytes=layers * run, pages=slots, groups=[geometry]
        )
        groups.append(
            HostPages(
                fd=fd,
                spec=spec,
                layers=layers,
                layout=str(host.layout),
                axes=[("layer", layers, run), ("state", math.prod(state), e)],
                kv_heads=state[0] if state else 1,
                head_size_k=math.prod(state[1:]),
                head_size_v=0,
                dtype=str(buffer.dtype).removeprefix("torch."),
                page_bytes=layers * run,
                mla=False,
                group=STATE_GROUP + i,
                pool=STATE_POOL + i,
                component=component,
                rule=("checkpoint", s.page_size),
                slots_per_page=1,
                quant="none",
            )
        )
    return groups


def swa_window(s: Settings) -> int:
    """The window SGLang keeps for the model (its model config's), or `StartupRefused`: with
    speculative decoding SGLang keeps a draft model's window too, which is not mapped."""
    from sglang.srt.runtime_context import get_server_args, process_model_config

    if getattr(get_server_args(), "speculative_algorithm", None):
        raise hybrid_refusal("swa", "with a speculative draft model is not mapped yet")
    try:
        window = process_model_config().sliding_window_size
    except Exception:  # SGLang's model config not built here: the model's own config.json
        window = sliding_window(s.model, s.revision)
    if not isinstance(window, int) or window < 1:
        raise _refuse(
            "the model's sliding window cannot be read from its config",
            "point --model-path at a model directory holding config.json",
        )
    return window


def sliding_window(model: str, revision: str | None = None) -> int | None:
    """The model's attention window in tokens, from its config.json (a local directory, or a
    hub snapshot in the local cache), read as SGLang's model config reads it."""
    path = Path(model) / "config.json"
    if not path.is_file():
        try:
            from huggingface_hub import try_to_load_from_cache

            found = try_to_load_from_cache(model, "config.json", revision=revision)
        except Exception:
            return None
        if not isinstance(found, str):
            return None
        path = Path(found)
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    text = config.get("text_config") or config
    for key in ("sliding_window_size", "sliding_window", "window_size"):
        value = text.get(key)
        if value is not None:
            return value if isinstance(value, int) else None
    return None


def _axes(order: tuple[str, ...], counts: dict[str, int], e: int) -> list[tuple[Any, int, int]]:
    """The record's axes in `order` (outermost first): (name, count, stride in bytes), each
    stride the product of the counts inside it."""
    axes: list[tuple[Any, int, int]] = []
    stride = e
    for name in reversed(order):
        axes.append((name, counts[name], stride))
        stride *= counts[name]
    return axes[::-1]


def state_format(s: Settings, pages: HostPages, rank: int) -> orbitkv.StateFormat:
    """The bytes of one record at `rank` (one record for every rank, MLA's): a page of every
    layer of its stage, in the host layout's byte order."""
    return orbitkv.StateFormat(
        dtype=s.dtype if pages.quant is None else pages.dtype,
        kv_quant=s.kv_cache_dtype if pages.quant is None else pages.quant,
        block_tokens=s.page_size,
        layers=pages.layers,
        layout=pages.axes,
        kv_heads=pages.kv_heads,
        head_size_k=pages.head_size_k,
        head_size_v=pages.head_size_v,
        engine="sglang",
        release=s.release,
        attention_backend=s.attention_backend,
        rank="replicated" if pages.mla else rank,
        tensor=s.tensor,
        pipeline=s.pipeline,
    )


def storage_layout(s: Settings, groups: list[HostPages]) -> orbitkv.StorageLayout:
    """The instance's layout: the KV group, then a hybrid model's other groups; one format per
    rank each (one for all, MLA's)."""
    return orbitkv.StorageLayout(
        [
            orbitkv.CacheGroup(
                id=pages.group,
                component=pages.component,
                block_tokens=s.page_size,
                # Rank 0's, as every rank says it (pipeline stages differ).
                page_bytes=_of_rank(s, pages, 0).page_bytes,
                formats=[
                    state_format(s, _of_rank(s, pages, r), r)
                    for r in range(1 if pages.mla else s.workers)
                ],
            )
            for pages in groups
        ],
        tensor=s.tensor,
        pipeline=s.pipeline,
    )


def _of_rank(s: Settings, pages: HostPages, rank: int) -> HostPages:
    """This rank's `pages` as rank `rank` holds them: its pipeline stage's layers."""
    if not s.stage_layers:
        return pages
    return stage_pages(pages, s.stage_layers[rank // s.tensor])


def identity(s: Settings) -> orbitkv.Identity:
    """The computation's identity: the model by content and every setting that changes the KV
    bytes; the host pool's placement and size are not part of it. `StartupRefused` when the
    model's content cannot be read."""
    try:
        return _resolve(s)
    except orbitkv.OrbitKVError as e:
        raise _refuse(
            f"the model's identity cannot be established ({e.detail})",
            "point --model-path at a readable model directory or hub snapshot, or set "
            "ORBITKV_MODEL_FINGERPRINT",
        ) from e


def _resolve(s: Settings) -> orbitkv.Identity:
    return orbitkv.resolve_identity(
        s.model,
        engine="sglang",
        release=s.release,
        dtype=s.dtype,
        kv_cache_dtype=s.kv_cache_dtype,
        quantization=s.quantization,
        attention_backend=s.attention_backend,
        cache_variant="full_attention",
        settings=[
            ("page_size", str(s.page_size).encode()),
            ("model_overrides", hashlib.sha256(s.overrides.encode()).hexdigest().encode()),
            ("weight_version", s.weight_version.encode()),
            ("parallel", f"tp{s.tensor}pp{s.pipeline}".encode()),
        ],
        revision=s.revision,
    )
