"""Weights changed in place after start-up (RLHF loops call the worker's `reload_weights` or
`update_weights`, directly or through `collective_rpc`): the identity resolved at start-up no
longer names the computation, so from the first such call on this instance serves and
publishes nothing until it restarts (a weight change needs a restart and a new identity). The
worker-side connector wraps vLLM's own worker methods to notice."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger("orbitkv.vllm")

# The worker methods that change weights in place.
METHODS = ("reload_weights", "start_weight_update", "update_weights")

_changed = False
_wrapped: set[tuple[type, str]] = set()


def changed() -> bool:
    """Whether this process's weights changed since start-up."""
    return _changed


def _mark(name: str) -> None:
    global _changed
    if not _changed:
        log.warning(
            "OrbitKV: the worker's %s changed the weights in place: this instance serves and "
            "publishes nothing more until it restarts",
            name,
        )
    _changed = True


def watch(cls: type) -> None:
    """Wraps `cls`'s weight-changing methods (once per class) so that a call marks the change
    before it runs."""
    for name in METHODS:
        real = cls.__dict__.get(name)
        if real is None or (cls, name) in _wrapped:
            continue

        def wrapper(
            *args: object, _real: Callable[..., Any] = real, _name: str = name, **kwargs: object
        ) -> object:
            _mark(_name)
            return _real(*args, **kwargs)

        setattr(cls, name, functools.wraps(real)(wrapper))
        _wrapped.add((cls, name))


def watch_vllm_workers() -> None:
    """Wraps the methods of vLLM's workers (the GPU worker and the CPU worker built on it)."""
    from vllm.v1.worker.gpu_worker import Worker

    watch(Worker)
    try:
        from vllm.v1.worker.cpu_worker import CPUWorker
    except ImportError:
        return
    watch(CPUWorker)


def reset() -> None:
    """Forgets a change: only for a process that hosts several instances (the tests)."""
    global _changed
    _changed = False
