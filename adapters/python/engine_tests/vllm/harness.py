"""A vLLM instance on CPU made of vLLM's real parts: its configuration, KV planner and v1
`Scheduler` (whose scheduler-side connector vLLM's factory loads from `orbitkv.vllm`), and a
worker-side connector made by the same factory, registered with the per-layer views vLLM builds
over a host pool the package mapped (or with vLLM's own CPU allocation). A step runs vLLM's own
worker-side connector lifecycle (`KVConnectorModelRunnerMixin._get_kv_connector_output`); where
the forward pass would run, the harness writes each newly full block's bytes, derived from its
hash."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import hashlib
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import orbitkv
import torch
from vllm import SamplingParams
from vllm.config import KVTransferConfig, VllmConfig, set_current_vllm_config
from vllm.distributed import parallel_state
from vllm.distributed.kv_transfer import kv_transfer_state
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1, KVConnectorRole
from vllm.distributed.kv_transfer.kv_connector.v1.multi_connector import (
    MultiKVConnectorMetadata,
    MultiKVConnectorStats,
    MultiKVConnectorWorkerMetadata,
)
from vllm.distributed.utils import get_pp_indices
from vllm.engine.arg_utils import EngineArgs
from vllm.forward_context import set_forward_context
from vllm.utils.hashing import get_hash_fn_by_name
from vllm.utils.torch_utils import kv_cache_dtype_str_to_dtype
from vllm.v1.attention.backends.utils import resolve_kv_cache_layout
from vllm.v1.core.kv_cache_planning import get_kv_cache_config_from_groups, get_kv_cache_groups
from vllm.v1.core.kv_cache_utils import (
    generate_scheduler_kv_cache_config,
    get_request_block_hasher,
    init_none_hash,
    resolve_kv_cache_block_sizes,
)
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheSpec,
    MambaSpec,
    MLAAttentionSpec,
    SlidingWindowSpec,
    create_kv_cache_views,
)
from vllm.v1.kv_cache_layout import KVCacheLayout
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager
from vllm.v1.worker.kv_connector_model_runner_mixin import KVConnectorModelRunnerMixin
from vllm.v1.worker.utils import allocate_kv_cache

BLOCK = 16
_distributed = False


def init_distributed(config: VllmConfig) -> None:
    """One gloo process group of one rank, for the whole test process (vLLM's rank queries)."""
    global _distributed
    if _distributed:
        return
    from vllm.distributed.parallel_state import (
        ensure_model_parallel_initialized,
        init_distributed_environment,
    )

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with set_current_vllm_config(config):
        init_distributed_environment(
            world_size=1,
            rank=0,
            local_rank=0,
            distributed_init_method=f"tcp://127.0.0.1:{port}",
            backend="gloo",
        )
        ensure_model_parallel_initialized(1, 1)
    _distributed = True


@contextlib.contextmanager
def _ranks(tp_rank: int, pp_rank: int) -> Iterator[None]:
    """vLLM's rank queries answer `tp_rank` and `pp_rank` (one process plays every rank)."""
    real = (
        parallel_state.get_tensor_model_parallel_rank,
        parallel_state.get_pipeline_model_parallel_rank,
    )
    parallel_state.get_tensor_model_parallel_rank = lambda: tp_rank
    parallel_state.get_pipeline_model_parallel_rank = lambda: pp_rank
    try:
        yield
    finally:
        (
            parallel_state.get_tensor_model_parallel_rank,
            parallel_state.get_pipeline_model_parallel_rank,
        ) = real


def kv_transfer(socket_path: str, **extra: object) -> dict[str, object]:
    config: dict[str, object] = {
        "kv_connector": "OrbitKVConnector",
        "kv_connector_module_path": "orbitkv.vllm",
        "kv_role": "kv_both",
        "kv_load_failure_policy": "recompute",
        "kv_connector_extra_config": {"socket": socket_path},
    }
    config.update(extra)
    return config


def engine_config(model: Path, transfer: dict[str, object], **args: object) -> VllmConfig:
    base: dict[str, object] = {
        "model": str(model),
        "skip_tokenizer_init": True,
        "dtype": "bfloat16",
        "max_model_len": 512,
        "block_size": BLOCK,
        "enable_prefix_caching": True,
        "max_num_seqs": 8,
        "max_num_batched_tokens": 512,
        "async_scheduling": False,
        "kv_transfer_config": transfer,
    }
    base.update(args)
    return EngineArgs(**base).create_engine_config()


@dataclass
class Instance:
    """One vLLM instance: its scheduler (with the scheduler-side connector) and one worker-side
    connector over views of `layout`."""

    model: Path
    engine_id: str
    socket: str
    layout: str = "LBNHC"
    blocks: int = 64
    args: dict[str, object] = field(default_factory=dict)
    extra: dict[str, object] = field(default_factory=dict)
    # Tensor-parallel ranks (one worker-side connector each), and those whose worker runs each
    # step (all by default; a rank left out never loads or publishes).
    tp: int = 1
    pp: int = 1
    stepping: tuple[int, ...] | None = None
    # Where the KV caches lie: "pool", vLLM's views over a host pool the package mapped
    # (registered in place); "allocate", vLLM's own `allocate_kv_cache` (plain CPU tensors,
    # staged).
    memory: str = "pool"
    # A hybrid model: its odd layers attend over a sliding window of this many tokens.
    window: int = 0
    # A connector configuration the scheduler runs first, beside OrbitKV, in vLLM's
    # `MultiConnector`. Its workers are OrbitKV's alone, given OrbitKV's part of each step's
    # metadata (what the `MultiConnector` worker does); no handshake reaches OrbitKV's
    # scheduler side, as when the other connector's comes first.
    beside: dict[str, object] | None = None
    # The model runner whose order of the connector's calls the steps follow: "v1" or "v2"
    # (vLLM's default on CUDA: a step's new blocks are zeroed before `handle_preemptions`).
    runner: str = "v1"

    def __post_init__(self) -> None:
        transfer = kv_transfer(self.socket, engine_id=self.engine_id, **self.extra)
        self.config = engine_config(
            self.model,
            transfer,
            tensor_parallel_size=self.tp,
            pipeline_parallel_size=self.pp,
            **self.args,
        )
        init_distributed(self.config)
        cfg = self.config
        hf = cfg.model_config.hf_config
        self.layer_names = [f"model.layers.{i}.self_attn.attn" for i in range(hf.num_hidden_layers)]
        specs = {n: self._spec(i) for i, n in enumerate(self.layer_names)}
        self.spec = specs[self.layer_names[0]]
        resolve_kv_cache_layout(cfg, [[self.layout]], list(specs.values()))
        groups = get_kv_cache_groups(cfg, specs)
        cfg.cache_config.num_gpu_blocks_override = self.blocks
        kvc = get_kv_cache_config_from_groups(cfg, groups, available_memory=64 << 20)
        kvc.kv_cache_layout = cfg.cache_config.kv_cache_layout
        sched_bs, hash_bs = resolve_kv_cache_block_sizes(kvc, cfg)
        kvc.hash_block_size = hash_bs
        cfg.cache_config.num_gpu_blocks = kvc.num_blocks
        self.kv_cache_config = kvc
        # Each layer's group (vLLM's planner groups the layers by spec).
        self.group_of = {n: i for i, g in enumerate(kvc.kv_cache_groups) for n in g.layer_names}
        self._views: list[dict[str, torch.Tensor]] = []
        self.workers = [self._worker(rank) for rank in range(self.tp * self.pp)]
        self.worker = self.workers[0]
        self.kv_caches = self._views[0]
        self.scheduler = Scheduler(
            vllm_config=self._composed() if self.beside is not None else cfg,
            kv_cache_config=generate_scheduler_kv_cache_config([kvc]),
            structured_output_manager=StructuredOutputManager(cfg),
            block_size=sched_bs,
            hash_block_size=hash_bs,
        )
        self.connector = self.scheduler.get_kv_connector()
        if self.beside is None:
            self.connector.set_xfer_handshake_metadata_pp_aware(
                {
                    (r // self.tp, r % self.tp): w.get_handshake_metadata()
                    for r, w in enumerate(self.workers)
                }
            )
        hash_fn = get_hash_fn_by_name(cfg.cache_config.prefix_caching_hash_algo)
        init_none_hash(hash_fn)
        self.hasher = get_request_block_hasher(hash_bs, hash_fn, cfg.num_hash_lookahead_tokens)
        self.token = 1
        self.freed: list[str] = []
        # The worker's stats as each step's KVConnectorOutput carried them.
        self.reported: list[dict[str, int]] = []
        # The `kv_transfer_params` each finished request's output carried.
        self.transfer_params: dict[str, dict[str, object]] = {}
        if self.beside is not None:
            # The first step's worker metadata carries the attention backend: the scheduler
            # side registers then.
            self.step()
            assert self.orbitkv.scheduler.session is not None, "registered from the metadata"
        # A running engine's workers have read their seal and registered their pools by the
        # time requests come; without it the first loads fail (and are recomputed).
        for w in self.workers:
            w.worker.session.sealed(wait=10.0)
        if self.orbitkv.scheduler.session is not None:
            self.orbitkv.scheduler.session.sealed(wait=10.0)

    @property
    def orbitkv(self) -> KVConnectorBase_V1:
        """The scheduler-side OrbitKV connector (a member of the `MultiConnector` with
        `beside`)."""
        if self.beside is None:
            return self.connector
        return self.connector._connectors[-1]  # type: ignore[attr-defined, no-any-return]

    def _composed(self) -> VllmConfig:
        """The configuration with `beside`, then OrbitKV, in a `MultiConnector`."""
        cfg = copy.copy(self.config)
        member = kv_transfer(self.socket, **self.extra)
        cfg.kv_transfer_config = KVTransferConfig(
            kv_connector="MultiConnector",
            kv_role="kv_both",
            kv_load_failure_policy="recompute",
            engine_id=self.engine_id,
            kv_connector_extra_config={"connectors": [self.beside, member]},
        )
        return cfg

    def _spec(self, layer: int) -> KVCacheSpec:
        """Layer `layer`'s KV cache spec, as the model's layer would give it: a Mamba layer's
        from the model class, padded to the attention page (as vLLM's platform aligns them)."""
        cfg = self.config
        hf = cfg.model_config.hf_config
        block, dtype = cfg.cache_config.block_size, cfg.model_config.dtype
        kv_dtype = kv_cache_dtype_str_to_dtype(cfg.cache_config.cache_dtype, cfg.model_config)
        # The layer types, Mamba layers named as the model's config names them.
        types = [t in ("mamba", "linear_attention") for t in getattr(hf, "layer_types", None) or []]
        if types and types[layer]:
            from vllm.model_executor.models import ModelRegistry

            model, _ = ModelRegistry.resolve_model_cls(
                cfg.model_config.architecture, model_config=cfg.model_config
            )
            attention = self._spec(types.index(False))
            return MambaSpec(
                shapes=model.get_mamba_state_shape_from_config(cfg),
                dtypes=model.get_mamba_state_dtype_from_config(cfg),
                block_size=block,
                page_size_padded=attention.page_size_bytes,
                mamba_cache_mode=cfg.cache_config.mamba_cache_mode,
            )
        if getattr(hf, "kv_lora_rank", None):
            return MLAAttentionSpec(
                block_size=block,
                num_kv_heads=1,
                head_size=hf.kv_lora_rank + hf.qk_rope_head_dim,
                dtype=dtype,
                cache_dtype_str=cfg.cache_config.cache_dtype,
            )
        heads = hf.num_key_value_heads // self.tp
        head = getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads
        # With Mamba layers, every other attention layer is windowed.
        attentions = [i for i, mamba in enumerate(types) if not mamba] or list(range(layer + 1))
        if self.window and attentions.index(layer) % 2:
            return SlidingWindowSpec(
                block_size=block,
                num_kv_heads=heads,
                head_size=head,
                dtype=kv_dtype,
                sliding_window=self.window,
            )
        return FullAttentionSpec(
            block_size=block, num_kv_heads=heads, head_size=head, dtype=kv_dtype
        )

    def _worker(self, rank: int) -> KVConnectorBase_V1:
        """The worker-side connector of rank `rank`, registered with views over its own
        memory."""
        cfg, kvc = self.config, self.kv_cache_config
        with set_current_vllm_config(cfg), _ranks(rank % self.tp, rank // self.tp):
            worker = KVConnectorFactory.create_connector(
                config=cfg, role=KVConnectorRole.WORKER, kv_cache_config=kvc
            )
        layout = KVCacheLayout[self.layout]
        caches: dict[str, torch.Tensor] = {}
        if self.memory == "allocate":
            caches = allocate_kv_cache(kvc, torch.device("cpu"), layout)
        else:
            raw = torch.frombuffer(
                self._pool_memory(kvc.kv_cache_tensors[0].size), dtype=torch.int8
            )
            for t in kvc.kv_cache_tensors:
                spec = kvc.kv_cache_groups[self.group_of[t.layers[0]]].kv_cache_spec
                views = create_kv_cache_views(raw, spec, kvc.num_blocks, layout, t)
                caches.update(zip(t.layers, views, strict=True))
        # A pipeline stage holds its own layers only.
        start, end = get_pp_indices(len(self.layer_names), rank // self.tp, self.pp)
        stage = set(self.layer_names[start:end])
        caches = {n: v for n, v in caches.items() if n in stage}
        worker.register_kv_caches(caches)
        self._views.append(caches)
        return worker

    def _pool_memory(self, size: int) -> memoryview:
        """`size` bytes of page memory in a host pool the package maps (an engine placing its
        KV caches in shared memory)."""
        pages = self.kv_cache_config.num_blocks
        return orbitkv.mapped.allocate(pages, size // pages).pages

    def new_request(
        self,
        rid: str,
        prompt: list[int],
        max_tokens: int = 2,
        transfer: dict[str, object] | None = None,
    ) -> Request:
        """A request with its block hashes, not yet added; `transfer`: its
        `kv_transfer_params` (a prefill/decode connector's)."""
        extra = {"kv_transfer_params": transfer} if transfer is not None else None
        return Request(
            request_id=rid,
            prompt_token_ids=prompt,
            sampling_params=SamplingParams(
                max_tokens=max_tokens, ignore_eos=True, extra_args=extra
            ),
            pooling_params=None,
            block_hasher=self.hasher,
        )

    def request(
        self,
        rid: str,
        prompt: list[int],
        max_tokens: int = 2,
        transfer: dict[str, object] | None = None,
    ) -> Request:
        r = self.new_request(rid, prompt, max_tokens, transfer)
        self.scheduler.add_request(r)
        return r

    def start_of(self, rid: str, prompt: list[int]) -> int:
        """Adds request `rid`, steps until it is scheduled, runs everything to the end, and
        returns the tokens it started from (local hits plus external tokens)."""
        return self.scheduled(rid, prompt)[0]

    def scheduled(self, rid: str, prompt: list[int]) -> tuple[int, Request]:
        """As `start_of`, with the request."""
        start, r = self.first_step(rid, prompt)
        self.run()
        return start, r

    def first_step(self, rid: str, prompt: list[int]) -> tuple[int, Request]:
        """Adds request `rid` and steps until it is scheduled: the tokens it started from,
        and the request (its blocks as that step left them)."""
        r = self.request(rid, prompt)
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline:
            so = self.step()
            new = [x for x in so.scheduled_new_reqs if x.req_id == r.request_id]
            if new:
                return int(new[0].num_computed_tokens), r
        raise AssertionError(f"{rid} never scheduled")

    def loaded(self, rid: str, prompt: list[int]) -> tuple[int, list[bytes], list[bytes]]:
        """As `start_of`; also the bytes of the blocks it started from, as they were when it
        was scheduled (in memory order), and what `_write` would have put in them."""
        r = self.request(rid, prompt)
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline:
            so = self.step()
            new = [x for x in so.scheduled_new_reqs if x.req_id == rid]
            if new:
                start = int(new[0].num_computed_tokens)
                blocks = self.scheduler.kv_cache_manager.get_block_ids(rid)[0][: start // BLOCK]
                pages = [self.page(b) for b in blocks]
                self.run()
                return (
                    start,
                    pages,
                    [self.expected(bytes(h)) for h in r.block_hashes[: len(blocks)]],
                )
        raise AssertionError(f"{rid} never scheduled")

    def page(self, block: int, group: int = 0) -> bytes:
        """The bytes of vLLM block `block` of `group`, every layer of it, in memory order."""
        out = b""
        for n in self.layer_names:
            if self.group_of[n] != group:
                continue
            x = self.kv_caches[n][block]
            order = sorted(range(x.dim()), key=lambda d: -x.stride(d))
            out += x.permute(order).contiguous().view(torch.uint8).numpy().tobytes()
        return out

    def expected(self, block_hash: bytes, group: int = 0) -> bytes:
        """The bytes `_write` puts in a block of this hash, every layer of `group`, in memory
        order."""
        out = b""
        for i, n in enumerate(self.layer_names):
            if self.group_of[n] != group:
                continue
            x = self.kv_caches[n][0]
            out += hashlib.shake_256(block_hash + bytes([i])).digest(x.numel() * x.element_size())
        return out

    def _write(
        self, caches: dict[str, torch.Tensor], group: int, block: int, block_hash: bytes
    ) -> None:
        """What the forward pass would write into a block of `group`: bytes derived from its
        hash."""
        for i, n in enumerate(self.layer_names):
            if n not in caches or self.group_of[n] != group:
                continue
            x = caches[n][block]
            size = x.numel() * x.element_size()
            data = hashlib.shake_256(block_hash + bytes([i])).digest(size)
            src = torch.frombuffer(bytearray(data), dtype=torch.uint8).view(x.dtype)
            order = sorted(range(x.dim()), key=lambda d: -x.stride(d))
            dst = x.permute(order)
            dst.copy_(src.view(dst.shape))

    def step(self) -> SchedulerOutput:
        """One scheduler step, its worker side, and the model's (faked) output."""
        so = self.scheduler.schedule()
        self.update(so, self.run_workers(so))
        return so

    def run_workers(self, so: SchedulerOutput) -> KVConnectorOutput:
        """Step `so` on the workers, as vLLM's model runner orders the connector's calls:
        the new blocks zeroed (Mamba models) after `handle_preemptions` (model runner V1) or
        before it (V2, `runner="v2"`); rank 0's output stands for all (the harness has no
        executor to aggregate them)."""
        outputs = []
        mine = so
        if isinstance(so.kv_connector_metadata, MultiKVConnectorMetadata):
            mine = dataclasses.replace(
                so, kv_connector_metadata=so.kv_connector_metadata.metadata[-1]
            )
        for rank in self.stepping if self.stepping is not None else range(len(self.workers)):
            kv_transfer_state._KV_CONNECTOR_AGENT = self.workers[rank]
            with set_forward_context(None, self.config):
                if self.runner == "v2":
                    self._zero(so, self._views[rank])
                self.workers[rank].handle_preemptions(mine.kv_connector_metadata)
                if self.runner == "v1":
                    self._zero(so, self._views[rank])
                with KVConnectorModelRunnerMixin._get_kv_connector_output(mine) as out:
                    self._forward(so, self._views[rank])
            outputs.append(out)
        return outputs[0]

    def update(self, so: SchedulerOutput, kv_out: KVConnectorOutput) -> None:
        """The model's (faked) output of step `so` back to the scheduler."""
        req_ids = list(so.num_scheduled_tokens)
        sampled = []
        for rid in req_ids:
            r = self.scheduler.requests[rid]
            sampled.append([self.token] if r.num_computed_tokens >= r.num_tokens else [])
            self.token += 1
        out = ModelRunnerOutput(
            req_ids=req_ids,
            req_id_to_index={rid: i for i, rid in enumerate(req_ids)},
            sampled_token_ids=sampled,
            kv_connector_output=kv_out,
        )
        self.freed += list(kv_out.finished_sending or ())
        if kv_out.kv_connector_stats is not None:
            self.reported.append(kv_out.kv_connector_stats.to_dict())
        if self.beside is not None:
            # What the `MultiConnector` worker reports: each member's part under its own key.
            if kv_out.kv_connector_worker_meta is not None:
                kv_out.kv_connector_worker_meta = MultiKVConnectorWorkerMetadata(
                    metadata=(None, kv_out.kv_connector_worker_meta)
                )
            if kv_out.kv_connector_stats is not None:
                kv_out.kv_connector_stats = MultiKVConnectorStats(
                    data={type(self.workers[0]).__name__: kv_out.kv_connector_stats}
                )
        for outputs in self.scheduler.update_from_output(so, out).values():
            for o in outputs.outputs:
                if o.kv_transfer_params is not None:
                    self.transfer_params[o.request_id] = o.kv_transfer_params

    def _zero(self, so: SchedulerOutput, caches: dict[str, torch.Tensor]) -> None:
        """Zeroes the blocks vLLM asks zeroed (new blocks of a Mamba model)."""
        for block in so.new_block_ids_to_zero or ():
            for view in caches.values():
                view[block].zero_()

    def _forward(self, so: SchedulerOutput, caches: dict[str, torch.Tensor]) -> None:
        """Writes the blocks this step fills, as the forward pass would."""
        state = {r.req_id: r.num_computed_tokens for r in so.scheduled_new_reqs}
        cached = so.scheduled_cached_reqs
        state.update(zip(cached.req_ids, cached.num_computed_tokens, strict=False))
        for rid, n in so.num_scheduled_tokens.items():
            r = self.scheduler.requests[rid]
            c = state[rid]
            groups = self.scheduler.kv_cache_manager.get_block_ids(rid)
            for group, blocks in enumerate(groups):
                if self._mamba(group):
                    # The state after the step's last token, in the block of that token.
                    end = c + n
                    i = -(-end // BLOCK) - 1
                    whole = end % BLOCK == 0 and i < len(r.block_hashes)
                    seed = bytes(r.block_hashes[i]) if whole else f"{rid}@{end}".encode()
                    self._write(caches, group, blocks[i], seed)
                    continue
                for i in range(c // BLOCK, min((c + n) // BLOCK, len(r.block_hashes))):
                    self._write(caches, group, blocks[i], bytes(r.block_hashes[i]))

    def _mamba(self, group: int) -> bool:
        return isinstance(self.kv_cache_config.kv_cache_groups[group].kv_cache_spec, MambaSpec)

    def run(self, seconds: float = 30.0) -> None:
        """Steps until every request is finished and every block given back, as vLLM's engine
        loop does (a finished request whose blocks wait for their copies keeps it stepping)."""
        deadline = time.monotonic() + seconds
        while self.scheduler.has_requests():
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"requests left after {seconds} s: {list(self.scheduler.requests)}"
                )
            if not self.step().num_scheduled_tokens:
                time.sleep(0.001)

    def close(self) -> None:
        for w in self.workers:
            w.shutdown()
        self.connector.shutdown()
