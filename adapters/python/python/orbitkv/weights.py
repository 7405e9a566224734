"""Weights changed in place after start-up (RLHF loops call an engine's weight-update
methods): the identity resolved at start-up no longer names the computation, so from the first
such call on the process serves and publishes nothing until it restarts (a weight change needs
a restart and a new identity). The adapters wrap their engine's own methods to notice
(`orbitkv.vllm`: the worker's; `orbitkv.sglang`: the scheduler's)."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger("orbitkv")

_changed = False
_wrapped: set[tuple[type, str]] = set()


def changed() -> bool:
    """Whether this process's weights changed since start-up."""
    return _changed


def _mark(name: str) -> None:
    global _changed
    if not _changed:
        log.warning(
            "OrbitKV: %s changed the weights in place: this instance serves and publishes "
            "nothing more until it restarts",
            name,
        )
    _changed = True


def watch(cls: type, methods: tuple[str, ...]) -> None:
    """Wraps `cls`'s weight-changing `methods` (once per class) so that a call marks the change
    before it runs."""
    for name in methods:
        real = cls.__dict__.get(name)
        if real is None or (cls, name) in _wrapped:
            continue

        def wrapper(
            *args: object, _real: Callable[..., Any] = real, _name: str = name, **kwargs: object
        ) -> object:
            _mark(f"{cls.__name__}.{_name}")
            return _real(*args, **kwargs)

        setattr(cls, name, functools.wraps(real)(wrapper))
        _wrapped.add((cls, name))


def reset() -> None:
    """Forgets a change: only for a process that hosts several instances (the tests)."""
    global _changed
    _changed = False
