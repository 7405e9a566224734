"""`OrbitKVConnector`: vLLM's KV connector for OrbitKV (`KVConnectorBase_V1` + `SupportsHMA`).
It refuses, at start-up, any configuration whose KV bytes it cannot name or place; serves a
prefix only when the daemon proves it for the same computation; and never fails a request: any
trouble with the daemon is 0 external tokens, or blocks vLLM recomputes.

    vllm serve MODEL --kv-transfer-config '{"kv_connector":"OrbitKVConnector",
      "kv_connector_module_path":"orbitkv.vllm","kv_role":"kv_both",
      "kv_load_failure_policy":"recompute"}'
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorHandshakeMetadata,
    KVConnectorMetadata,
    KVConnectorRole,
    KVConnectorTransferResults,
    KVConnectorWorkerMetadata,
    SupportsHMA,
)

from orbitkv.vllm import weights
from orbitkv.vllm.metadata import OrbitKVMetadata, OrbitKVWorkerMetadata
from orbitkv.vllm.scheduler import SchedulerSide
from orbitkv.vllm.settings import settings_from
from orbitkv.vllm.stats import OrbitKVStats
from orbitkv.vllm.worker import WorkerSide

if TYPE_CHECKING:
    import torch
    from vllm.config import VllmConfig
    from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorStats
    from vllm.forward_context import ForwardContext
    from vllm.v1.attention.backend import AttentionMetadata
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.outputs import KVConnectorOutput
    from vllm.v1.request import Request

log = logging.getLogger("orbitkv.vllm")


@dataclass
class OrbitKVHandshake(KVConnectorHandshakeMetadata):
    """What a worker tells the scheduler side at start-up: the attention backend it chose."""

    attention_backend: str


def attention_backend(vllm_config: VllmConfig) -> str:
    """The attention backend this worker's layers use, by name; `none` where no model layer
    exists (the connector's own tests)."""
    layers = getattr(vllm_config.compilation_config, "static_forward_context", {}) or {}
    names = set()
    for layer in layers.values():
        get = getattr(layer, "get_attn_backend", None)
        backend = get() if callable(get) else getattr(layer, "attn_backend", None)
        if backend is not None and hasattr(backend, "get_name"):
            names.add(str(backend.get_name()))
    return ",".join(sorted(names)) or "none"


def _layout(vllm_config: VllmConfig, kv_cache_config: KVCacheConfig | None) -> str | None:
    layout = getattr(kv_cache_config, "kv_cache_layout", None)
    return layout if layout is not None else vllm_config.cache_config.kv_cache_layout


class OrbitKVConnector(KVConnectorBase_V1, SupportsHMA):
    """vLLM's connector to an `orbitkv serve` on this node."""

    def __init__(
        self,
        vllm_config: VllmConfig,
        role: KVConnectorRole,
        kv_cache_config: KVCacheConfig | None = None,
    ) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        self.settings = settings_from(vllm_config)
        if self.settings.lora:
            log.warning(
                "OrbitKV: LoRA has no identity yet: requests with a LoRA get no external tokens "
                "and are never published"
            )
        layout = _layout(vllm_config, kv_cache_config)
        self.scheduler: SchedulerSide | None = None
        self.worker: WorkerSide | None = None
        if role == KVConnectorRole.SCHEDULER:
            self.scheduler = SchedulerSide(self.settings, kv_cache_config, layout)
        else:
            from vllm.distributed.parallel_state import (
                get_pipeline_model_parallel_rank,
                get_tensor_model_parallel_rank,
            )

            rank = self.settings.rank(
                get_tensor_model_parallel_rank(), get_pipeline_model_parallel_rank()
            )
            self.worker = WorkerSide(
                self.settings, kv_cache_config, layout, rank, attention_backend(vllm_config)
            )

    @classmethod
    def get_required_kvcache_layout(cls, vllm_config: VllmConfig) -> str | None:
        # vLLM's own choice; the placement goes into the pool geometry only.
        return None

    # -- scheduler side ----------------------------------------------------------------------

    def _sched(self) -> SchedulerSide:
        if self.scheduler is None:
            raise RuntimeError("a scheduler-side call on the worker-side connector")
        return self.scheduler

    def _work(self) -> WorkerSide:
        if self.worker is None:
            raise RuntimeError("a worker-side call on the scheduler-side connector")
        return self.worker

    def on_new_request(self, request: Request) -> None:
        self._sched().on_new_request(request)

    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        return self._sched().matched_tokens(request, num_computed_tokens)

    def update_state_after_alloc(
        self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int
    ) -> None:
        self._sched().after_alloc(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        return self._sched().build_meta(scheduler_output)

    def update_connector_output(self, connector_output: KVConnectorOutput) -> None:
        self._sched().loads_reported(
            connector_output.finished_recving,
            connector_output.failed_recving,
            connector_output.invalid_block_ids,
        )
        meta = connector_output.kv_connector_worker_meta
        if isinstance(meta, OrbitKVWorkerMetadata):
            if meta.backends:
                # Not waiting for the seal: a step is running.
                self._sched().handshake(set(meta.backends), wait=0.0)
            if meta.weights_changed:
                self._sched().weights_changed()
            self._sched().loaded(meta.loaded)

    def request_finished(
        self, request: Request, block_ids: list[int]
    ) -> tuple[bool, dict[str, Any] | None]:
        return self._sched().finished(request)

    def request_finished_all_groups(
        self, request: Request, block_ids: tuple[list[int], ...]
    ) -> tuple[bool, dict[str, Any] | None]:
        return self._sched().finished(request)

    def set_xfer_handshake_metadata(
        self, metadata: dict[int, KVConnectorHandshakeMetadata]
    ) -> None:
        self._handshake(metadata.values())

    def set_xfer_handshake_metadata_pp_aware(
        self, metadata: dict[tuple[int, int], KVConnectorHandshakeMetadata]
    ) -> None:
        self._handshake(metadata.values())

    def _handshake(self, metadata: Iterable[KVConnectorHandshakeMetadata]) -> None:
        backends = {m.attention_backend for m in metadata if isinstance(m, OrbitKVHandshake)}
        if backends:
            self._sched().handshake(backends)

    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None) -> KVConnectorStats:
        return OrbitKVStats(data=dict(data or {}))

    def get_kv_connector_stats(self) -> KVConnectorStats | None:
        side = self.scheduler if self.scheduler is not None else self.worker
        return side.stats.since_last() if side is not None else None

    # -- worker side -------------------------------------------------------------------------

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        self._work().register(kv_caches)

    def get_handshake_metadata(self) -> KVConnectorHandshakeMetadata | None:
        return OrbitKVHandshake(self._work().backend)

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: object) -> None:
        meta = self._get_connector_metadata()
        if isinstance(meta, OrbitKVMetadata):
            self._work().load(meta)

    def wait_for_layer_load(self, layer_name: str) -> None:
        # Loads are asynchronous: they complete in start_load_kv, and the request they serve is
        # computed in a later step.
        return None

    def save_kv_layer(
        self,
        layer_name: str,
        kv_layer: torch.Tensor,
        attn_metadata: AttentionMetadata,
        **kwargs: object,
    ) -> None:
        # Publishes go out once the whole step has written its blocks (wait_for_save).
        return None

    def wait_for_save(self) -> None:
        meta = self._get_connector_metadata()
        if isinstance(meta, OrbitKVMetadata):
            self._work().save(meta)

    def handle_preemptions(self, kv_connector_metadata: KVConnectorMetadata) -> None:
        if isinstance(kv_connector_metadata, OrbitKVMetadata):
            self._work().preempted(kv_connector_metadata)

    def build_connector_worker_meta(self) -> KVConnectorWorkerMetadata | None:
        backends = self._work().tell_backend()
        loaded = self._work().take_loaded()
        if not backends and not loaded and not weights.changed():
            return None
        return OrbitKVWorkerMetadata(
            weights_changed=weights.changed(), backends=backends, loaded=loaded
        )

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        sending, _ = self._work().finished(finished_req_ids)
        received, _ = self._work().take_received()
        return sending, (received or None)

    def get_transfer_results(self, finished_req_ids: set[str]) -> KVConnectorTransferResults:
        sending, _ = self._work().finished(finished_req_ids)
        received, failed = self._work().take_received()
        return KVConnectorTransferResults(
            finished_sending=set(sending or ()),
            finished_recving=received,
            failed_recving=failed,
        )

    def get_block_ids_with_load_errors(self) -> set[int]:
        return self._work().take_load_errors()

    def shutdown(self) -> None:
        if self.worker is not None:
            self.worker.close()
        if self.scheduler is not None:
            self.scheduler.close()
