"""OrbitKV as SGLang's HiCache storage backend (SGLang 0.5.23):

    python -m sglang.launch_server --model-path MODEL --enable-hierarchical-cache \\
      --hicache-storage-backend dynamic --hicache-storage-backend-extra-config \\
      '{"backend_name":"orbitkv","module_path":"orbitkv.sglang","class_name":"OrbitKVStorage",
        "interface_v1":1,"allocator":"shm","hicache_storage_pass_prefix_keys":true}'
"""

from orbitkv.sglang.settings import StartupRefused
from orbitkv.sglang.storage import OrbitKVStorage

__all__ = ["OrbitKVStorage", "StartupRefused"]
