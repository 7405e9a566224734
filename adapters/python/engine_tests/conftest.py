"""What the engine adapters' tests share (each engine's tests run in a pytest process of their
own): the package tests' `orbitkv serve` per test module, and tiny model configurations (a
`config.json` and no weights: no forward pass runs)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

# Before an engine is imported: vLLM's platform is unspecified on a machine without a GPU, and
# both engines' caches stay in the temporary directory.
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
_tmp = Path(os.environ.get("TMPDIR", "/tmp"))
os.environ.setdefault("VLLM_CACHE_ROOT", str(_tmp / "vllm-cache"))
os.environ.setdefault("SGLANG_CACHE_DIR", str(_tmp / "sglang-cache"))

sys.path.insert(0, str(Path(__file__).parents[1] / "tests"))

from daemon import Daemon  # noqa: E402  (the package tests' daemon)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = Daemon(tmp_path_factory.mktemp("orbitkv"))
    yield d
    d.stop()


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Llama of 2 layers, 4 attention heads and 2 KV heads of 32."""
    from transformers import LlamaConfig

    d = tmp_path_factory.mktemp("tiny-llama")
    LlamaConfig(
        architectures=["LlamaForCausalLM"],
        vocab_size=1024,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=512,
        torch_dtype="bfloat16",
    ).save_pretrained(d)
    return d


@pytest.fixture(scope="session")
def mla_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A DeepSeek-V2 of 2 layers: an MLA model (latent 64, RoPE 16)."""
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
