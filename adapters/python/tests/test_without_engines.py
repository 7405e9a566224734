"""What imports where no engine is installed: a GPU machine has PyTorch only, and its check
drives the vLLM connector's page memory (`orbitkv.vllm.pages`) with torch alone."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is not None, reason="vllm is installed in this environment"
)


def python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)


def test_the_vllm_page_memory_imports_without_vllm() -> None:
    done = python("import sys, orbitkv.vllm, orbitkv.vllm.pages\nassert 'vllm' not in sys.modules")
    assert done.returncode == 0, done.stderr


def test_the_connector_needs_vllm_only_when_asked_for() -> None:
    done = python("import orbitkv.vllm\norbitkv.vllm.OrbitKVConnector")
    assert done.returncode != 0 and "No module named 'vllm'" in done.stderr
