"""The KV cache shapes the GPU check allocates (`device/vllm_shapes.json`), computed here with
vLLM's own planner: the GPU machine has no vLLM. A dense model (layers outermost, and blocks
outermost), a hybrid (full attention beside sliding windows), a Mamba hybrid and an MLA model,
each with vLLM's groups, tensors and strides. The test fails when the planner's answer and the
file differ; `ORBITKV_WRITE_SHAPES=1` rewrites the file."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from harness import engine_config, init_distributed, kv_transfer
from vllm.v1.attention.backends.utils import resolve_kv_cache_layout
from vllm.v1.core.kv_cache_planning import get_kv_cache_config_from_groups, get_kv_cache_groups
from vllm.v1.kv_cache_interface import (
    AttentionSpec,
    FullAttentionSpec,
    KVCacheSpec,
    MambaSpec,
    MLAAttentionSpec,
    SlidingWindowSpec,
)

SHAPES = Path(__file__).resolve().parents[2] / "device" / "vllm_shapes.json"
BLOCKS = 160
BLOCK = 16


def _dense() -> list[AttentionSpec]:
    """A Llama 3 8B: 32 layers of 8 KV heads of 128."""
    return [
        FullAttentionSpec(block_size=BLOCK, num_kv_heads=8, head_size=128, dtype=torch.bfloat16)
    ] * 32


def _hybrid() -> list[AttentionSpec]:
    """A gpt-oss 20B: 24 layers of 8 KV heads of 64, every other one over a 128-token window."""
    full = FullAttentionSpec(block_size=BLOCK, num_kv_heads=8, head_size=64, dtype=torch.bfloat16)
    window = SlidingWindowSpec(
        block_size=BLOCK, num_kv_heads=8, head_size=64, dtype=torch.bfloat16, sliding_window=128
    )
    return [window if i % 2 else full for i in range(24)]


def _mamba() -> list[KVCacheSpec]:
    """A Mamba 2 hybrid of 24 layers, one in four attention (8 KV heads of 128): each Mamba
    layer's conv state (3 x 1024, bf16) and SSM state (8 heads of 64 x 16, fp32) padded to
    the attention page, in `align` mode."""
    full = FullAttentionSpec(block_size=BLOCK, num_kv_heads=8, head_size=128, dtype=torch.bfloat16)
    mamba = MambaSpec(
        block_size=BLOCK,
        shapes=((3, 1024), (8, 64, 16)),
        dtypes=(torch.bfloat16, torch.float32),
        page_size_padded=full.page_size_bytes,
        mamba_cache_mode="align",
    )
    return [full if i % 4 == 3 else mamba for i in range(24)]


def _mla() -> list[AttentionSpec]:
    """A DeepSeek V2 Lite: 27 layers of one latent row of 512 and RoPE 64."""
    spec = MLAAttentionSpec(
        block_size=BLOCK,
        num_kv_heads=1,
        head_size=576,
        dtype=torch.bfloat16,
        cache_dtype_str="auto",
    )
    return [spec] * 27


# Each model: its layers' specs, its tensor-parallel ranks, and vLLM's KV cache layout.
MODELS = {
    "dense": (_dense, 1, "LBNHC"),
    "dense-blocks-outermost": (_dense, 1, "BLNHC"),
    "hybrid": (_hybrid, 1, "LBNHC"),
    "mamba-hybrid": (_mamba, 1, "LBNHC"),
    "mla": (_mla, 2, "LBNHC"),
}


def describe(model_dir: Path, name: str) -> dict[str, object]:
    """vLLM's plan for model `name`: its groups and the tensors their layers lie in."""
    make, tensor, layout = MODELS[name]
    cfg = engine_config(model_dir, kv_transfer("/nonexistent/orbitkv.sock"))
    init_distributed(cfg)
    specs = {f"model.layers.{i}.attn": s for i, s in enumerate(make())}
    resolve_kv_cache_layout(cfg, [[layout]], list(specs.values()))
    cfg.cache_config.num_gpu_blocks_override = BLOCKS
    kvc = get_kv_cache_config_from_groups(
        cfg, get_kv_cache_groups(cfg, specs), available_memory=64 << 30
    )
    groups = []
    for i, g in enumerate(kvc.kv_cache_groups):
        spec = g.kv_cache_spec
        kind = {
            FullAttentionSpec: "full",
            SlidingWindowSpec: "window",
            MLAAttentionSpec: "mla",
            MambaSpec: "mamba",
        }
        groups.append(
            {
                "id": i,
                "kind": kind[type(spec)],
                "window": int(getattr(spec, "sliding_window", None) or 0),
                "layers": list(g.layer_names),
                "layer_bytes": spec.page_size_bytes,
                "block_tokens": spec.block_size,
                # A Mamba layer's states fill its page in part.
                "state_bytes": spec.state_content_size_bytes
                if isinstance(spec, MambaSpec)
                else spec.page_size_bytes,
            }
        )
    return {
        "name": name,
        "layout": layout,
        "tensor": tensor,
        "blocks": kvc.num_blocks,
        "tensors": [
            {
                "size": t.size,
                "offset": t.offset,
                "layer_stride": t.layer_stride,
                "block_stride": t.block_stride,
                "layers": list(t.layers),
            }
            for t in kvc.kv_cache_tensors
        ],
        "groups": groups,
    }


def test_the_gpu_checks_shapes_are_vllms(model_dir: Path) -> None:
    shapes = [describe(model_dir, name) for name in MODELS]
    text = json.dumps(shapes, indent=1) + "\n"
    if os.environ.get("ORBITKV_WRITE_SHAPES") == "1":
        SHAPES.write_text(text)
    assert SHAPES.read_text() == text, "vLLM's planner changed: ORBITKV_WRITE_SHAPES=1 rewrites"
