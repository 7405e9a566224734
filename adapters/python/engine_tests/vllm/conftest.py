"""The vLLM adapter's tests: the real vLLM 0.33 classes on CPU (one pytest process), each test
module with its own `orbitkv serve` (`../conftest.py`)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
