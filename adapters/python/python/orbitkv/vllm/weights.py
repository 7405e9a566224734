"""vLLM's weight-changing worker methods (`reload_weights`, `start_weight_update`,
`update_weights`, called directly or through `collective_rpc`), watched as `orbitkv.weights`
says."""

from __future__ import annotations

from orbitkv.weights import changed, reset, watch

# The worker methods that change weights in place.
METHODS = ("reload_weights", "start_weight_update", "update_weights")

__all__ = ["METHODS", "changed", "reset", "watch_vllm_workers"]


def watch_vllm_workers() -> None:
    """Wraps the methods of vLLM's workers (the GPU worker and the CPU worker built on it)."""
    from vllm.v1.worker.gpu_worker import Worker

    watch(Worker, METHODS)
    try:
        from vllm.v1.worker.cpu_worker import CPUWorker
    except ImportError:
        return
    watch(CPUWorker, METHODS)
