"""Start-up refuses, in one line saying why and what to change, what the backend cannot
serve."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from daemon import Daemon
from harness import Rank
from orbitkv.sglang import StartupRefused


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


def test_the_daemon_being_away_is_not_a_refusal(model_dir: Path, tmp_path: Path) -> None:
    r = Rank(model_dir, "away", str(tmp_path / "nobody.sock"))
    try:
        assert r.exists(r.keys(list(range(32)))) == 0
    finally:
        r.close()
