"""What the scheduler side hands the workers each step (vLLM pickles it to every worker)."""

from __future__ import annotations

from dataclasses import dataclass, field

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorMetadata,
    KVConnectorWorkerMetadata,
)


@dataclass(frozen=True)
class LoadSpec:
    """A request's pages to load under one lease: per page (index into the request's hash list,
    the vLLM block it goes to, the rank whose record it is), and the blocks already known lost
    (the proof shrank between Query and Acquire, or the Acquire failed)."""

    request: str
    lease: int
    pages: tuple[tuple[int, int, int], ...]
    lost: tuple[int, ...] = ()


@dataclass(frozen=True)
class PublishSpec:
    """A block that became full in this step: its vLLM block id, hash, parent hash (empty for
    the first block) and token range."""

    request: str
    block: int
    hash: bytes
    parent: bytes
    start: int
    end: int


@dataclass
class OrbitKVMetadata(KVConnectorMetadata):
    """One step's loads and publishes, and the requests preempted (vLLM frees their blocks)."""

    loads: list[LoadSpec] = field(default_factory=list)
    publishes: list[PublishSpec] = field(default_factory=list)
    preempted: set[str] = field(default_factory=set)


@dataclass
class OrbitKVWorkerMetadata(KVConnectorWorkerMetadata):
    """What the workers tell the scheduler side each step: whether weights changed in place."""

    weights_changed: bool = False

    def aggregate(self, other: KVConnectorWorkerMetadata) -> KVConnectorWorkerMetadata:
        changed = isinstance(other, OrbitKVWorkerMetadata) and other.weights_changed
        return OrbitKVWorkerMetadata(weights_changed=self.weights_changed or changed)
