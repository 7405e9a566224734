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


@pytest.fixture(scope="session")
def mamba_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Granite 4 hybrid of 4 layers: Mamba 2 layers (8 heads of 32, state 8, conv 4) between
    attention layers (2 KV heads of 128)."""
    import json

    d = tmp_path_factory.mktemp("tiny-granite-hybrid")
    config = {
        "architectures": ["GraniteMoeHybridForCausalLM"],
        "model_type": "granitemoehybrid",
        "vocab_size": 1024,
        "hidden_size": 256,
        "intermediate_size": 512,
        "shared_intermediate_size": 512,
        "num_hidden_layers": 4,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "max_position_embeddings": 4096,
        "num_local_experts": 0,
        "num_experts_per_tok": 0,
        "layer_types": ["mamba", "attention", "mamba", "attention"],
        "mamba_n_heads": 8,
        "mamba_d_head": 32,
        "mamba_n_groups": 1,
        "mamba_d_state": 8,
        "mamba_d_conv": 4,
        "mamba_expand": 1,
        "mamba_chunk_size": 16,
        "torch_dtype": "bfloat16",
        "position_embedding_type": "rope",
        "tie_word_embeddings": True,
    }
    (d / "config.json").write_text(json.dumps(config))
    return d
