"""Records are shared only by the same computation: each setting that changes the KV bytes
(or the model's content, or the scope) gives 0 external tokens; a LoRA request gets 0 and is
never published."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from daemon import Daemon
from harness import BLOCK, Instance

PROMPT = [(i * 41 + 3) % 1000 for i in range(4 * BLOCK)] + [1]


@pytest.fixture(scope="module")
def published(daemon: Daemon, model_dir: Path) -> Iterator[Daemon]:
    """PROMPT's four blocks, published and durable."""
    p = Instance(model_dir, "base", daemon.socket)
    assert p.start_of("w", PROMPT) == 0
    assert p.worker.worker.wait_durable(10.0)
    # The same computation finds them.
    same = Instance(model_dir, "same", daemon.socket)
    assert same.start_of("r", PROMPT) == 4 * BLOCK
    same.close()
    p.close()
    yield daemon


def zero(model: Path, socket: str, name: str, **kw: object) -> None:
    inst = Instance(model, name, socket, **kw)  # type: ignore[arg-type]
    try:
        assert inst.start_of("r", PROMPT) == 0, f"{name}: another computation's records"
    finally:
        inst.close()


def test_another_dtype(published: Daemon, model_dir: Path) -> None:
    zero(model_dir, published.socket, "fp16", args={"dtype": "float16"})


def test_another_kv_cache_dtype(published: Daemon, model_dir: Path) -> None:
    zero(model_dir, published.socket, "fp8", args={"kv_cache_dtype": "fp8_e4m3"})


def test_fp8_kv_is_shared_by_the_same_computation(published: Daemon, model_dir: Path) -> None:
    """fp8 KV (one scale per tensor, the checkpoint's) is served to an instance of the same
    settings, byte for byte."""
    fp8: dict[str, object] = {"kv_cache_dtype": "fp8_e4m3"}
    prompt = [(i * 43 + 9) % 1000 for i in range(4 * BLOCK)] + [1]
    p = Instance(model_dir, "fp8-w", published.socket, args=fp8)
    c = Instance(model_dir, "fp8-r", published.socket, args=fp8)
    try:
        # vLLM keeps fp8 KV as bytes.
        assert p.spec.dtype == torch.uint8 and p.spec.page_size_bytes == c.spec.page_size_bytes
        assert p.start_of("w", prompt) == 0
        assert p.worker.worker.wait_durable(10.0)
        start, loaded, expected = c.loaded("r", prompt)
        assert start == 4 * BLOCK
        assert loaded == expected, "the bytes published"
    finally:
        c.close()
        p.close()


def test_another_page_order(published: Daemon, model_dir: Path) -> None:
    zero(model_dir, published.socket, "hnd", layout="LBHNC")


def test_another_block_size(published: Daemon, model_dir: Path) -> None:
    zero(model_dir, published.socket, "bs32", args={"block_size": 32})


def test_one_byte_of_the_model_config(published: Daemon, model_dir: Path, tmp_path: Path) -> None:
    other = tmp_path / "model"
    shutil.copytree(model_dir, other)
    config = json.loads((other / "config.json").read_text())
    config["rms_norm_eps"] = config.get("rms_norm_eps", 1e-6) * 2
    (other / "config.json").write_text(json.dumps(config))
    zero(other, published.socket, "edited")


def test_another_scope(published: Daemon, model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORBITKV_CACHE_SCOPE", "tenant-b")
    zero(model_dir, published.socket, "scoped")


def test_placement_is_not_identity(published: Daemon, model_dir: Path) -> None:
    """Block-outermost with the same page order: the same records."""
    inst = Instance(model_dir, "blnhc", published.socket, layout="BLNHC")
    try:
        assert inst.start_of("r", PROMPT) == 4 * BLOCK
    finally:
        inst.close()


def test_a_lora_request_gets_nothing_and_publishes_nothing(
    published: Daemon, model_dir: Path
) -> None:
    """A LoRA-enabled instance serves its base-model requests; a request with a LoRA gets 0
    external tokens and its blocks are never published (LoRA has no identity yet)."""
    from vllm import SamplingParams
    from vllm.lora.request import LoRARequest
    from vllm.v1.request import Request

    inst = Instance(model_dir, "lora", published.socket, args={"enable_lora": True})
    try:
        assert inst.start_of("base", PROMPT) == 4 * BLOCK
        before = inst.worker.worker.stats["published_bytes"]
        r = Request(
            request_id="adapted",
            prompt_token_ids=PROMPT,
            sampling_params=SamplingParams(max_tokens=2, ignore_eos=True),
            pooling_params=None,
            lora_request=LoRARequest("adapter", 1, "/nonexistent/adapter"),
            block_hasher=inst.hasher,
        )
        inst.scheduler.add_request(r)
        so = inst.step()
        assert [x.num_computed_tokens for x in so.scheduled_new_reqs] == [0]
        inst.run()
        assert inst.worker.worker.stats["published_bytes"] == before
    finally:
        inst.close()
