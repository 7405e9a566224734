"""What the scheduler side hands the workers each step (vLLM pickles it to every worker)."""

from __future__ import annotations

from dataclasses import dataclass, field

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorMetadata,
    KVConnectorWorkerMetadata,
)


@dataclass(frozen=True)
class LoadSpec:
    """A request's pages to load under one lease: per page (group, index into the request's
    hash list, the vLLM block it goes to, the rank whose record it is), and the blocks already
    known lost (the proof shrank between Query and Acquire, or the Acquire failed).

    Every load is asynchronous: the request is computed only once every rank has loaded, so
    no block computed over a failed load is published. A failed block is a load error, which
    vLLM recomputes from. With several KV cache groups vLLM cannot map a failed block back to
    its request: a request with any page lost or failed is reported failed as a whole
    (`whole`), which vLLM recomputes from its start."""

    request: str
    lease: int
    pages: tuple[tuple[int, int, int, int], ...]
    lost: tuple[int, ...] = ()
    whole: bool = False
    # The epoch the lease was acquired under: a Load goes under it, so that after the instance
    # sealed again (a daemon restart: lease ids start again) it is refused, not served
    # another lease's records.
    epoch: int = 0


@dataclass(frozen=True)
class PublishSpec:
    """A block that became full in this step: its group, vLLM block id, hash, parent hash
    (empty for the first block) and token range."""

    request: str
    group: int
    block: int
    hash: bytes
    parent: bytes
    start: int
    end: int


@dataclass
class OrbitKVMetadata(KVConnectorMetadata):
    """One step's loads and publishes, the requests preempted (vLLM frees their blocks) and
    the blocks handed out this step (a sliding-window block freed mid-request may be among
    them: its publish must be copied out before the step writes it)."""

    loads: list[LoadSpec] = field(default_factory=list)
    publishes: list[PublishSpec] = field(default_factory=list)
    preempted: set[str] = field(default_factory=set)
    allocated: set[int] = field(default_factory=set)


@dataclass
class OrbitKVWorkerMetadata(KVConnectorWorkerMetadata):
    """What the workers tell the scheduler side each step: whether weights changed in place,
    the leases whose loads they ran, and the attention backends they chose (in their first
    step: the handshake's content, for a scheduler whose handshake went to another connector,
    as vLLM's `MultiConnector` does)."""

    weights_changed: bool = False
    backends: frozenset[str] = frozenset()
    # The (epoch, lease) pairs whose loads the workers ran in this step: the scheduler side
    # gives them back.
    loaded: frozenset[tuple[int, int]] = frozenset()

    def aggregate(self, other: KVConnectorWorkerMetadata) -> KVConnectorWorkerMetadata:
        if not isinstance(other, OrbitKVWorkerMetadata):
            return self
        return OrbitKVWorkerMetadata(
            weights_changed=self.weights_changed or other.weights_changed,
            backends=self.backends | other.backends,
            loaded=self.loaded | other.loaded,
        )
