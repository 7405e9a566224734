"""Fixtures: a real `orbitkv serve` per test module, in its own temporary directory."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from daemon import REPO, SEND_TIMEOUT_MS, Daemon, orbitkv_bin

__all__ = ["REPO", "SEND_TIMEOUT_MS", "Daemon", "orbitkv_bin"]


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = Daemon(tmp_path_factory.mktemp("orbitkv"))
    yield d
    d.stop()
