"""The vLLM adapter's tests: the real vLLM 0.33 classes on CPU (one pytest process), each test
module with its own `orbitkv serve`."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

# Before vLLM is imported: without it the platform is unspecified on a machine without a GPU.
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("VLLM_CACHE_ROOT", str(Path(os.environ.get("TMPDIR", "/tmp")) / "vllm-cache"))

import pytest

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1] / "tests"))

from daemon import Daemon  # noqa: E402  (the package tests' daemon)
from models import tiny_llama  # noqa: E402


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = Daemon(tmp_path_factory.mktemp("orbitkv"))
    yield d
    d.stop()


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_llama(tmp_path_factory.mktemp("tiny-llama"))
