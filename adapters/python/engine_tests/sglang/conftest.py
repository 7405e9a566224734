"""The SGLang backend's tests: the real SGLang 0.5.23 classes on CPU (one pytest process), each
test module with its own `orbitkv serve`."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

os.environ.setdefault(
    "SGLANG_CACHE_DIR", str(Path(os.environ.get("TMPDIR", "/tmp")) / "sglang-cache")
)

import pytest

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1] / "tests"))

from daemon import Daemon  # noqa: E402  (the package tests' daemon)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = Daemon(tmp_path_factory.mktemp("orbitkv"))
    yield d
    d.stop()


def write_model(d: Path, **overrides: object) -> Path:
    """A tiny Llama configuration (no weights: no forward pass runs)."""
    from transformers import LlamaConfig

    config: dict[str, object] = {
        "architectures": ["LlamaForCausalLM"],
        "vocab_size": 1024,
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "max_position_embeddings": 512,
        "torch_dtype": "bfloat16",
    }
    config.update(overrides)
    LlamaConfig(**config).save_pretrained(d)
    return d


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_model(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def mla_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny DeepSeek-V2 configuration: an MLA model (latent 64, RoPE 16)."""
    from transformers import DeepseekV2Config

    d = tmp_path_factory.mktemp("tiny-deepseek")
    DeepseekV2Config(
        architectures=["DeepseekV2ForCausalLM"],
        vocab_size=1024,
        hidden_size=128,
        intermediate_size=256,
        moe_intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        q_lora_rank=None,
        kv_lora_rank=64,
        qk_nope_head_dim=32,
        qk_rope_head_dim=16,
        v_head_dim=32,
        max_position_embeddings=512,
        torch_dtype="bfloat16",
    ).save_pretrained(d)
    return d
