"""Type stubs of the native module (the Rust code in adapters/python/src)."""

from collections.abc import Sequence
from os import PathLike
from types import TracebackType
from typing import Literal, final

__all__ = [
    "MAX_NAME",
    "MAX_QUERY_BLOCKS",
    "PROTOCOL_VERSION",
    "RANK_REPLICATED",
    "SOCKET_VAR",
    "CacheGroup",
    "Connection",
    "ConnectionLost",
    "DaemonNotFound",
    "Done",
    "GroupGeometry",
    "HostPool",
    "Identity",
    "InvalidInput",
    "Leased",
    "Miss",
    "OrbitKVError",
    "Pages",
    "PoolRegistered",
    "PoolSpec",
    "Proof",
    "ProofLoad",
    "ProtocolViolation",
    "RefusedError",
    "Sealed",
    "StateFormat",
    "StorageLayout",
    "TimedOut",
    "__version__",
    "resolve_identity",
    "sglang_namespace_seed",
    "sglang_page_hashes",
    "socket_candidates",
    "vllm_block_hashes",
]

__version__: str
PROTOCOL_VERSION: int
MAX_NAME: int
MAX_QUERY_BLOCKS: int
RANK_REPLICATED: int
SOCKET_VAR: str

class OrbitKVError(Exception):
    code: str
    retryable: bool
    retry_after: float
    detail: str

class RefusedError(OrbitKVError): ...
class ConnectionLost(OrbitKVError): ...

class DaemonNotFound(OrbitKVError):
    tried: list[str]

class ProtocolViolation(OrbitKVError): ...
class InvalidInput(OrbitKVError): ...
class TimedOut(OrbitKVError): ...

@final
class Identity:
    text: str
    model_dir: str
    model_digest_kind: Literal["artifacts", "operator"]
    model_digest: str
    hashed_bytes: int
    fields: list[tuple[str, str]]
    scope: str | None
    @property
    def digest(self) -> bytes: ...

def resolve_identity(
    model: str,
    *,
    engine: Literal["vllm", "sglang"],
    release: str,
    dtype: str,
    kv_cache_dtype: str,
    quantization: str,
    attention_backend: str,
    cache_variant: str,
    settings: Sequence[tuple[str, bytes]] = ...,
    revision: str | None = None,
    hub_cache: str | PathLike[str] | None = None,
    lora: bool = False,
    threads: int | None = None,
) -> Identity: ...
def vllm_block_hashes(
    tokens: Sequence[int],
    block_size: int,
    *,
    algo: Literal["sha256_cbor", "xxhash_cbor"] = "sha256_cbor",
    seed: str | None = None,
    parent: bytes | None = None,
    start_token: int = 0,
    cache_salt: str | None = None,
    mm: Sequence[tuple[str, int, int]] = ...,
) -> list[bytes]: ...
def sglang_page_hashes(
    tokens: Sequence[int], page_size: int, *, prior: bytes | None = None
) -> list[bytes]: ...
def sglang_namespace_seed(
    extra_key: str | None = None, cache_salt: str | None = None
) -> bytes | None: ...
def socket_candidates(socket: str | PathLike[str] | None = None) -> list[str]: ...

_Dim = Literal["layer", "page", "token", "kv_head", "head_dim", "kv_split", "state"]

@final
class StateFormat:
    def __new__(
        cls,
        *,
        dtype: str,
        kv_quant: str,
        block_tokens: int,
        layers: int,
        layout: Sequence[tuple[_Dim, int, int]],
        kv_heads: int,
        head_size_k: int,
        head_size_v: int,
        engine: Literal["vllm", "sglang"],
        release: str,
        attention_backend: str,
        rank: int | Literal["replicated"] | None = None,
        tensor: int = 1,
        pipeline: int = 1,
        context: int = 1,
    ) -> StateFormat: ...
    @property
    def record_bytes(self) -> int | None: ...
    def encode(self) -> bytes: ...
    def digest(self) -> bytes: ...

@final
class CacheGroup:
    def __new__(
        cls,
        *,
        id: int,
        component: str,
        block_tokens: int,
        page_bytes: int,
        formats: Sequence[StateFormat],
    ) -> CacheGroup: ...
    @property
    def id(self) -> int: ...
    @property
    def component(self) -> str: ...

@final
class StorageLayout:
    def __new__(
        cls,
        groups: Sequence[CacheGroup],
        *,
        tensor: int = 1,
        pipeline: int = 1,
        context: int = 1,
    ) -> StorageLayout: ...
    def encode(self) -> bytes: ...
    def digest(self) -> bytes: ...
    def format_of(self, group: int, rank: int) -> StateFormat | None: ...
    @property
    def groups(self) -> list[int]: ...

@final
class GroupGeometry:
    group: int
    layers: int
    offset: int
    page_stride: int
    layer_stride: int
    layer_bytes: int
    parts: int
    part_stride: int
    layers_inside: bool
    def __new__(
        cls,
        *,
        group: int,
        layers: int,
        offset: int,
        page_stride: int,
        layer_stride: int,
        layer_bytes: int,
        parts: int = 1,
        part_stride: int = 0,
        layers_inside: bool = False,
    ) -> GroupGeometry: ...
    @staticmethod
    def packed(
        *,
        group: int,
        layers: int,
        offset: int,
        layer_stride: int,
        layer_bytes: int,
        page_bytes: int,
    ) -> GroupGeometry: ...

@final
class PoolSpec:
    def __new__(
        cls,
        *,
        pool: int,
        page_bytes: int,
        pages: int,
        groups: Sequence[GroupGeometry],
        aliased: bool = False,
    ) -> PoolSpec: ...
    @property
    def pool(self) -> int: ...
    @property
    def page_bytes(self) -> int: ...
    @property
    def pages(self) -> int: ...
    @property
    def aliased(self) -> bool: ...
    @property
    def groups(self) -> list[GroupGeometry]: ...

@final
class HostPool:
    def __new__(cls, spec: PoolSpec, *, states_only: bool = False) -> HostPool: ...
    @property
    def spec(self) -> PoolSpec: ...
    @property
    def fd(self) -> int: ...
    @property
    def data_offset(self) -> int: ...
    def generation(self, index: int) -> int: ...
    def reuse(self, index: int) -> int: ...
    def revoke(self, index: int) -> int: ...
    def leases(self, index: int) -> int: ...
    def write_group(self, index: int, group: int, data: bytes | bytearray) -> None: ...
    def read_group(self, index: int, group: int) -> bytes: ...
    def write(self, index: int, offset: int, data: bytes | bytearray) -> None: ...
    def read(self, index: int, offset: int, length: int) -> bytes: ...

@final
class Sealed:
    @property
    def session(self) -> int: ...
    @property
    def epoch(self) -> int: ...
    @property
    def namespace(self) -> bytes: ...
    @property
    def token(self) -> bytes: ...

@final
class PoolRegistered:
    pool: int

@final
class ProofLoad:
    group: int
    rank: int
    blocks: list[int]

@final
class Proof:
    boundary: int
    loads: list[ProofLoad]

@final
class Miss:
    reason: int
    reason_name: str | None
    detail: str

@final
class Leased:
    lease: int
    ttl_ms: int
    proof: Proof

@final
class Pages:
    kind: Literal["loaded", "copied", "durable"]
    statuses: list[str]
    retry_after: float
    @property
    def all_ok(self) -> bool: ...

@final
class Done:
    kind: Literal["released", "synced"]

_Reply = Sealed | PoolRegistered | Proof | Miss | Leased | Pages | Done | str
_GroupHashes = Sequence[tuple[int, Sequence[bytes]]]
_LoadPage = tuple[int, int, int, int, int, int, int, int]
_PublishPage = tuple[int, int, bytes, bytes, int, int, int, int, int]

@final
class Connection:
    def __new__(
        cls,
        socket: str | PathLike[str] | None = None,
        *,
        client: str = "orbitkv-python",
        handshake_timeout: float = 10.0,
        send_timeout: float = 10.0,
    ) -> Connection: ...
    @property
    def socket(self) -> str: ...
    @property
    def daemon_pid(self) -> int | None: ...
    def daemon_state(self) -> Literal["running", "stopped", "gone"] | None: ...
    @property
    def server(self) -> str: ...
    @property
    def closed(self) -> str | None: ...
    def close(self) -> None: ...
    def __enter__(self) -> Connection: ...
    def __exit__(
        self,
        ty: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...
    def wait(self, request: int, timeout: float | None = None) -> _Reply: ...
    def poll(self, request: int) -> _Reply | None: ...
    def forget(self, request: int) -> None: ...
    def submit_register(
        self,
        *,
        instance: str,
        role: Literal["scheduler", "worker"],
        rank: int,
        workers: int,
        identity: bytes,
        layout: bytes,
        domain: str,
        rules: Sequence[tuple[int, str, int]],
        formats: Sequence[bytes] = ...,
        model: str = ...,
        revision: str = ...,
        scope: str = ...,
        seal_timeout_ms: int = 60000,
        no_scheduler: bool = False,
    ) -> int: ...
    def await_seal(self, request: int, timeout: float | None = None) -> Sealed: ...
    def register_pool(
        self, token: bytes, pool: HostPool, *, timeout: float | None = None
    ) -> int: ...
    def register_engine_memory_pool(
        self,
        token: bytes,
        states: HostPool,
        memory_fd: int,
        offset: int,
        *,
        timeout: float | None = None,
    ) -> int: ...
    def register_device_pool(
        self,
        token: bytes,
        states: HostPool,
        device: int,
        ipc_handle: bytes,
        offset: int,
        uuid: bytes = ...,
        *,
        timeout: float | None = None,
    ) -> int: ...
    def unregister_pool(self, token: bytes, pool: int) -> None: ...
    def submit_query(
        self, token: bytes, epoch: int, origin: int, end: int, groups: _GroupHashes
    ) -> int: ...
    def query(
        self, token: bytes, epoch: int, origin: int, end: int, groups: _GroupHashes
    ) -> Proof | Miss: ...
    def submit_acquire(
        self, token: bytes, epoch: int, origin: int, end: int, groups: _GroupHashes
    ) -> int: ...
    def acquire(
        self, token: bytes, epoch: int, origin: int, end: int, groups: _GroupHashes
    ) -> Leased | Miss: ...
    def submit_load(
        self, token: bytes, epoch: int, lease: int, pages: Sequence[_LoadPage]
    ) -> int: ...
    def load(
        self, token: bytes, epoch: int, lease: int, pages: Sequence[_LoadPage]
    ) -> list[str]: ...
    def submit_publish(self, token: bytes, epoch: int, pages: Sequence[_PublishPage]) -> int: ...
    def publish(
        self, token: bytes, epoch: int, pages: Sequence[_PublishPage]
    ) -> tuple[Pages, Pages]: ...
    def submit_release(self, token: bytes, lease: int) -> int: ...
    def release(self, token: bytes, lease: int) -> None: ...
    def sync(self) -> None: ...
    def stats(self) -> str: ...
