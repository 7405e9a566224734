"""Tiny model configurations for the engine adapters' tests (`engine_tests/`): a directory
with a `config.json` (no weights; no forward pass runs), enough for the engines' configuration
and identity by content."""

from __future__ import annotations

from pathlib import Path


def tiny_llama(d: Path, **overrides: object) -> Path:
    """A Llama of 2 layers, 4 attention heads and 2 KV heads of 32."""
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


def tiny_deepseek(d: Path) -> Path:
    """A DeepSeek-V2 of 2 layers: an MLA model (latent 64, RoPE 16)."""
    from transformers import DeepseekV2Config

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
