"""The connector's counters in vLLM's stats path: each side reports what it counted since its
last report; vLLM sums the workers' and logs them."""

from __future__ import annotations

from dataclasses import dataclass

from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorStats


@dataclass
class OrbitKVStats(KVConnectorStats):
    """Counters by name: queries, hit tokens, loaded and published bytes, and failures by
    reason (`load_<page status>`, `publish_<page status>`, `acquire_failures`, `lost_blocks`,
    `failed_loads`: requests whose load failed on some rank, recomputed)."""

    def reset(self) -> None:
        self.data.clear()

    def aggregate(self, other: KVConnectorStats) -> KVConnectorStats:
        for k, v in other.data.items():
            self.data[k] = self.data.get(k, 0) + v
        return self

    def reduce(self) -> dict[str, int | float]:
        return dict(self.data)

    def is_empty(self) -> bool:
        return not any(self.data.values())


class Counters:
    """Counters, and what was last reported of them."""

    def __init__(self, *names: str) -> None:
        self.total: dict[str, int] = dict.fromkeys(names, 0)
        self._reported: dict[str, int] = {}

    def add(self, name: str, n: int = 1) -> None:
        self.total[name] = self.total.get(name, 0) + n

    def __getitem__(self, name: str) -> int:
        return self.total.get(name, 0)

    def since_last(self) -> OrbitKVStats | None:
        """The counts since the last call, or `None` when nothing moved."""
        delta = {k: v - self._reported.get(k, 0) for k, v in self.total.items()}
        delta = {k: v for k, v in delta.items() if v}
        self._reported = dict(self.total)
        return OrbitKVStats(data=delta) if delta else None
