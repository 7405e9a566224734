"""Start-up refuses, in one line saying why and what to change, what the backend cannot
serve."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest
from daemon import Daemon
from harness import Rank
from orbitkv.sglang import OrbitKVStorage, StartupRefused
from orbitkv.sglang.settings import host_pages
from sglang.srt.mem_cache.hicache_storage import PoolName
from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost


def test_without_prefix_keys_a_pages_position_is_unknown(daemon: Daemon, model_dir: Path) -> None:
    with pytest.raises(StartupRefused, match="hicache_storage_pass_prefix_keys"):
        Rank(
            model_dir, "no-prefix", daemon.socket, extra={"hicache_storage_pass_prefix_keys": False}
        )


def test_the_v1_calls_are_required(daemon: Daemon, model_dir: Path) -> None:
    with pytest.raises(StartupRefused, match="interface_v1"):
        Rank(model_dir, "no-v1", daemon.socket, extra={"interface_v1": 0})


def test_a_model_whose_content_cannot_be_read(
    daemon: Daemon, model_dir: Path, tmp_path: Path
) -> None:
    broken = tmp_path / "model"
    shutil.copytree(model_dir, broken)
    (broken / "model.safetensors").symlink_to(tmp_path / "gone")
    with pytest.raises(StartupRefused, match="ORBITKV_MODEL_FINGERPRINT"):
        Rank(broken, "unreadable", daemon.socket)


def test_host_pools_not_mapped_are_refused_by_name(daemon: Daemon, model_dir: Path) -> None:
    """An indexer pool; a sliding-window pool of a model with no window in its config; any
    pool added once the rank has registered (its layout is sealed)."""
    r = Rank(model_dir, "hybrid", daemon.socket)
    try:
        r.backend.register_mem_host_pool_v2(r.host, PoolName.KV)
        with pytest.raises(StartupRefused, match="'swa' beside the KV pages was added after"):
            r.backend.register_mem_host_pool_v2(r.host, PoolName.SWA)
        # As before the rank registered:
        r.backend.register_mem_pool_host(r.host)
        with pytest.raises(StartupRefused, match="'indexer'"):
            r.backend.register_mem_host_pool_v2(r.host, PoolName.INDEXER)
        with pytest.raises(StartupRefused, match="sliding window cannot be read"):
            r.backend.register_mem_host_pool_v2(r.host, PoolName.SWA)
    finally:
        r.close()


def test_pipeline_parallelism_with_mla_is_refused(daemon: Daemon, mla_model_dir: Path) -> None:
    """One copy of an MLA page for every rank has one layer count; stages have several."""
    r = Rank(mla_model_dir, "pp-mla", daemon.socket, mla=True)
    r.close()
    with pytest.raises(StartupRefused, match="pipeline parallelism with MLA"):
        OrbitKVStorage(dataclasses.replace(r.backend.config, pp_size=2))


def test_a_host_pool_subclass_is_refused(daemon: Daemon, model_dir: Path) -> None:
    """A subclass (the MXFP8 pool) keeps parts of its pages elsewhere (scales)."""

    class Scaled(MHATokenToKVPoolHost):
        pass

    r = Rank(model_dir, "scaled", daemon.socket)
    r.close()
    r.host.__class__ = Scaled
    with pytest.raises(StartupRefused, match="Scaled is not mapped"):
        host_pages(r.host)


def test_the_daemon_being_away_is_not_a_refusal(model_dir: Path, tmp_path: Path) -> None:
    r = Rank(model_dir, "away", str(tmp_path / "nobody.sock"))
    try:
        assert r.exists(r.keys(list(range(32)))) == 0
    finally:
        r.close()
