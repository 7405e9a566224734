"""OrbitKV for inference engines.

The package an engine host installs to use an OrbitKV daemon (``orbitkv serve``) as its prefix
cache. Everything that must agree bit for bit with the daemon comes from the native module,
computed by the daemon's own Rust code and never rewritten in Python:

- ``resolve_identity``: the computation identity of a model (by content, or from
  ``ORBITKV_MODEL_FINGERPRINT``) and the engine's settings;
- ``StateFormat``, ``CacheGroup``, ``StorageLayout``: what a record's bytes are, and their
  canonical encodings;
- ``GroupGeometry``, ``PoolSpec``, ``HostPool``: where pages lie in an engine's pool, and host
  pools in shared memory fenced page by page;
- ``vllm_block_hashes``, ``sglang_page_hashes``, ``sglang_namespace_seed``: the engines' own
  prefix hashes, for self-checks;
- ``Connection``: a session with the daemon, many requests outstanding at once; calls that wait
  release the GIL;
- ``mapped``: host pools mapped into this process, found again by address (memory an engine
  places inside one is registered in place);
- ``refusals``: the adapters' start-up refusals (``StartupRefused``);
- ``naming``: each engine instance's name on the node.

Errors are ``OrbitKVError`` subclasses carrying ``code``, ``retryable``, ``retry_after`` and
``detail``.
"""

from orbitkv import _native, mapped, naming, refusals
from orbitkv._native import *  # noqa: F403 - the package is the native module's names

__all__ = [*_native.__all__, "mapped", "naming", "refusals"]
