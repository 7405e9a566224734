"""Engine instance names. Each engine instance on a node needs its own: the daemon gathers a
round of registrations by name, and refuses a live instance's name to another computation.
The adapters name their instances with these functions."""

from __future__ import annotations

from collections.abc import Mapping

from orbitkv._native import MAX_NAME, InvalidInput


def _checked(name: str, source: str) -> str:
    if not name or len(name.encode()) > MAX_NAME:
        raise InvalidInput(f"instance name {name!r} from {source}: 1 to {MAX_NAME} bytes")
    return name


def vllm_instance(engine_id: str) -> str:
    """A vLLM instance's name: its `kv_transfer_config.engine_id` (which vLLM suffixes per
    data-parallel rank, so each rank's engine is its own instance)."""
    return _checked(engine_id, "kv_transfer_config.engine_id")


def sglang_instance(extra_config: Mapping[str, object] | None, port: int, dp_rank: int) -> str:
    """An SGLang instance's name: the storage backend's extra config key `instance` (suffixed
    `-dp<dp_rank>` past data-parallel rank 0: each rank is an instance), else
    `sglang-<port>-dp<dp_rank>` (the server's port is unique on the node)."""
    configured = (extra_config or {}).get("instance")
    if configured is None:
        return _checked(f"sglang-{port}-dp{dp_rank}", "the server's port and data-parallel rank")
    if not isinstance(configured, str):
        raise InvalidInput(f"extra config `instance`: a string, not {configured!r}")
    name = f"{configured}-dp{dp_rank}" if dp_rank else configured
    return _checked(name, "the extra config key `instance`")
