"""Start-up refuses, in one line saying why and what to change, every configuration whose KV
bytes the connector cannot name or place."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from harness import Instance, engine_config, kv_transfer
from orbitkv.vllm import StartupRefused
from orbitkv.vllm.settings import kv_groups, settings_from
from vllm.v1.kv_cache_interface import (
    ChunkedLocalAttentionSpec,
    CrossAttentionSpec,
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheSpec,
    KVQuantMode,
    MambaSpec,
    MLAAttentionSpec,
    SinkFullAttentionSpec,
    SlidingWindowSpec,
    SparseCacheRole,
)

# The shape every attention spec below shares: 16 tokens, 2 heads of 32, bf16.
_SHAPE: dict[str, object] = {
    "block_size": 16,
    "num_kv_heads": 2,
    "head_size": 32,
    "dtype": torch.bfloat16,
}
_FULL = FullAttentionSpec(**_SHAPE)  # type: ignore[arg-type]


def groups(*specs: KVCacheSpec, draft: bool = False) -> KVCacheConfig:
    return KVCacheConfig(
        num_blocks=4,
        kv_cache_tensors=[],
        kv_cache_groups=[
            KVCacheGroupSpec([f"layer.{i}"], spec, is_eagle_group=draft and i > 0)
            for i, spec in enumerate(specs)
        ],
    )


def refused(model: Path, match: str, **kw: object) -> None:
    with pytest.raises(StartupRefused, match=match) as e:
        Instance(model, "refused", "/nonexistent/orbitkv.sock", **kw)  # type: ignore[arg-type]
    message = str(e.value)
    assert "\n" not in message and message.startswith("OrbitKVConnector: "), message


def test_the_fail_policy_is_refused(model_dir: Path) -> None:
    refused(model_dir, "recompute", extra={"kv_load_failure_policy": "fail"})


def test_xxhash_is_refused(model_dir: Path) -> None:
    refused(model_dir, "xxhash has no hash domain", args={"prefix_caching_hash_algo": "xxhash"})


def test_xxhash_cbor_without_a_seed_is_refused(
    model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    refused(model_dir, "PYTHONHASHSEED", args={"prefix_caching_hash_algo": "xxhash_cbor"})


def test_a_layout_with_a_page_in_several_runs_is_refused(model_dir: Path) -> None:
    refused(model_dir, "LHBNC", layout="LHBNC")


def test_expandable_segments_are_refused(model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM refuses them too for a connector, unless its cumem allocator is on; the connector
    refuses them either way."""
    config = engine_config(model_dir, kv_transfer("/nonexistent/orbitkv.sock"))
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    with pytest.raises(StartupRefused, match="expandable_segments"):
        settings_from(config)


def test_the_daemon_being_away_is_not_a_refusal(model_dir: Path) -> None:
    """No daemon: the instance starts, and every request gets 0 external tokens."""
    inst = Instance(model_dir, "alone", "/nonexistent/orbitkv.sock")
    try:
        r = inst.request("r", list(range(40)))
        so = inst.step()
        assert [x.num_computed_tokens for x in so.scheduled_new_reqs] == [0]
        inst.run()
        assert r.is_finished()
    finally:
        inst.close()


def test_kv_quantization_with_scales_of_its_own_is_refused() -> None:
    """Per-token-head int8 keeps scales besides the page: its bytes alone are not the state."""

    def config(dtype: torch.dtype, mode: KVQuantMode) -> KVCacheConfig:
        spec = FullAttentionSpec(
            block_size=16, num_kv_heads=2, head_size=32, dtype=dtype, kv_quant_mode=mode
        )
        return KVCacheConfig(
            num_blocks=4,
            kv_cache_tensors=[],
            kv_cache_groups=[KVCacheGroupSpec(["layer.0"], spec)],
        )

    with pytest.raises(StartupRefused, match="quantization mode not mapped"):
        kv_groups(config(torch.int8, KVQuantMode.INT8_PER_TOKEN_HEAD), "LBNHC")
    (fp8,) = kv_groups(config(torch.float8_e4m3fn, KVQuantMode.FP8_PER_TENSOR), "LBNHC")
    assert fp8.layer_bytes == 16 * 2 * 64


@pytest.mark.parametrize(
    ("config", "named"),
    [
        (
            groups(_FULL, ChunkedLocalAttentionSpec(**_SHAPE, attention_chunk_size=64)),
            "ChunkedLocal",
        ),  # type: ignore[arg-type]
        (groups(SinkFullAttentionSpec(**_SHAPE, sink_len=4)), "SinkFullAttentionSpec"),  # type: ignore[arg-type]
        (groups(CrossAttentionSpec(**_SHAPE)), "CrossAttentionSpec"),  # type: ignore[arg-type]
        (
            groups(_FULL, MambaSpec(block_size=16, shapes=((4, 8),), dtypes=(torch.float32,))),
            "MambaSpec",
        ),
        (
            groups(
                MLAAttentionSpec(
                    block_size=16,
                    num_kv_heads=1,
                    head_size=64,
                    dtype=torch.bfloat16,
                    cache_role=SparseCacheRole.INDEXER,
                )
            ),
            "DSA\\) indexer",
        ),
        (groups(_FULL, _FULL, draft=True), "speculative draft model's layers"),
        (
            groups(_FULL, SlidingWindowSpec(**_SHAPE, sliding_window=64, extra_retained_tokens=16)),  # type: ignore[arg-type]
            "retains extra blocks for speculative decoding",
        ),
        (
            groups(
                _FULL,
                MLAAttentionSpec(block_size=16, num_kv_heads=1, head_size=64, dtype=torch.bfloat16),
            ),
            "kinds \\['full', 'mla'\\]",
        ),
    ],
)
def test_a_group_kind_not_mapped_names_itself(config: KVCacheConfig, named: str) -> None:
    """Chunked-local, sink, cross-attention, Mamba outside `align` mode, DSA indexer and draft
    groups are refused at start-up by name, never treated as attention KV."""
    with pytest.raises(StartupRefused, match=named) as e:
        kv_groups(config, "LBNHC")
    assert "\n" not in str(e.value)
