"""SGLang's storage metrics (`--enable-hicache-storage-metrics`): `get_stats()` is SGLang's
`StorageMetrics`, the pages and bandwidth of each call since the last one, and SGLang's own
collector logs it. Without the flag, or past the bound between two calls, nothing gathers."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from daemon import Daemon
from harness import PAGE, Rank
from orbitkv.sglang import storage
from sglang.srt.observability.metrics_collector import StorageMetrics, StorageMetricsCollector

TOKENS = [(i * 67 + 3) % 1000 for i in range(3 * PAGE)]


def observed(
    collector: StorageMetricsCollector, name: str, labels: dict[str, str]
) -> tuple[float, float]:
    """(count, sum) of what the collector's histogram `name` observed under `labels`."""
    samples = {
        s.name.rsplit("_", 1)[-1]: s.value
        for family in getattr(collector, f"histogram_{name}").collect()
        for s in family.samples
        if s.labels == labels
    }
    return samples["count"], samples["sum"]


def test_get_stats_is_sglangs_storage_metrics(daemon: Daemon, model_dir: Path) -> None:
    w = Rank(model_dir, "metrics-w", daemon.socket, metrics=True)
    r = Rank(model_dir, "metrics-r", daemon.socket, metrics=True)
    try:
        keys, _ = w.publish(TOKENS)
        t0 = time.perf_counter()
        assert r.get(keys)[0] == [True] * 3
        took = time.perf_counter() - t0
        backup, prefetch = w.backend.get_stats(), r.backend.get_stats()
        assert isinstance(backup, StorageMetrics) and isinstance(prefetch, StorageMetrics)
        assert backup.backup_pgs == [3] and not backup.prefetch_pgs
        assert prefetch.prefetch_pgs == [3] and not prefetch.backup_pgs
        assert backup.backup_bandwidth[0] > 0 and not backup.prefetch_bandwidth
        # Three pages over at most the whole call, in GiB/s.
        assert r.backend.pages is not None
        floor = 3 * r.backend.pages.page_bytes / took / (1 << 30)
        assert len(prefetch.prefetch_bandwidth) == 1 and prefetch.prefetch_bandwidth[0] >= floor
        # Since the last call: nothing.
        assert r.backend.get_stats() == StorageMetrics()

        # What SGLang's radix cache does with it at each HiCache event check.
        labels = {"storage_backend": "orbitkv", "tp_rank": "0"}
        collector = StorageMetricsCollector(labels)
        for m in (prefetch, backup):
            if not hasattr(m, "prefetch_stats"):
                m.prefetch_stats = {}  # type: ignore[attr-defined]
            collector.log_storage_metrics(m)
        assert observed(collector, "prefetch_pgs", labels) == (1, 3)
        assert observed(collector, "backup_pgs", labels) == (1, 3)
        count, total = observed(collector, "backup_bandwidth", labels)
        assert count == 1 and total == backup.backup_bandwidth[0]
    finally:
        w.close()
        r.close()


def test_metrics_gather_only_when_on_and_bounded(
    daemon: Daemon, model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    off = Rank(model_dir, "metrics-off", daemon.socket)
    on = Rank(model_dir, "metrics-on", daemon.socket, metrics=True)
    monkeypatch.setattr(storage, "METRICS_MAX", 2)
    try:
        keys, _ = off.publish([t + 1 for t in TOKENS])
        assert off.backend.get_stats() == StorageMetrics()
        for _ in range(3):
            assert on.get(keys)[0] == [True] * 3
            assert off.get(keys)[0] == [True] * 3
        assert off.backend.get_stats() == StorageMetrics()
        m = on.backend.get_stats()
        assert m.prefetch_pgs == [3, 3] and len(m.prefetch_bandwidth) == 2
    finally:
        off.close()
        on.close()
