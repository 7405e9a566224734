"""vLLM's KV connector for OrbitKV. Load it with

--kv-transfer-config '{"kv_connector":"OrbitKVConnector",
  "kv_connector_module_path":"orbitkv.vllm","kv_role":"kv_both",
  "kv_load_failure_policy":"recompute"}'
"""

from orbitkv.vllm.connector import OrbitKVConnector, OrbitKVHandshake
from orbitkv.vllm.settings import StartupRefused

__all__ = ["OrbitKVConnector", "OrbitKVHandshake", "StartupRefused"]
