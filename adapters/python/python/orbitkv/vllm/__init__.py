"""vLLM's KV connector for OrbitKV. Load it with

--kv-transfer-config '{"kv_connector":"OrbitKVConnector",
  "kv_connector_module_path":"orbitkv.vllm","kv_role":"kv_both",
  "kv_load_failure_policy":"recompute"}'

The connector is imported on first use: the modules that do not need vLLM (`pages`, which a GPU
check drives with torch alone) import without it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from orbitkv.vllm.connector import OrbitKVConnector, OrbitKVHandshake
    from orbitkv.vllm.settings import StartupRefused

__all__ = ["OrbitKVConnector", "OrbitKVHandshake", "StartupRefused"]

_HOME = {
    "OrbitKVConnector": "orbitkv.vllm.connector",
    "OrbitKVHandshake": "orbitkv.vllm.connector",
    "StartupRefused": "orbitkv.vllm.settings",
}


def __getattr__(name: str) -> Any:  # noqa: ANN401 (the attribute's own type)
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)
