"""What the package computes equals what the engines and the Rust CLI compute on the same
inputs: the engines' hash vectors (state/tests/vectors, made by the engines' own code), `orbitkv
hash` and `orbitkv identity`."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import orbitkv
import pytest
from conftest import REPO, orbitkv_bin
from engine import Engine

VECTORS = json.loads((REPO / "state" / "tests" / "vectors" / "engine_hashes.json").read_text())


def cli(*args: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    out = subprocess.run(
        [orbitkv_bin(), *args, "--json"], check=True, capture_output=True, text=True, env=env
    )
    return json.loads(out.stdout)


@pytest.mark.parametrize("case", VECTORS["vllm"], ids=lambda c: c["name"])
def test_vllm_hashes_equal_the_engines(case: dict[str, Any]) -> None:
    assert not case["lora"], "LoRA requests are never hashed here"
    got = orbitkv.vllm_block_hashes(
        case["token_ids"],
        case["block_size"],
        algo=case["algo"],
        seed=case["PYTHONHASHSEED"],
        cache_salt=case["cache_salt"],
    )
    assert [h.hex() for h in got] == case["block_hashes_hex"]


@pytest.mark.parametrize("case", VECTORS["sglang"], ids=lambda c: c["name"])
def test_sglang_hashes_equal_the_engines(case: dict[str, Any]) -> None:
    seed = orbitkv.sglang_namespace_seed(case["extra_key"], case["cache_salt"])
    assert (seed.hex() if seed else None) == case["namespace_seed_hex"]
    prior = bytes.fromhex(case["prior_hash_hex"]) if case["prior_hash_hex"] else seed
    tokens = case["token_ids"]
    page = case["page_size"] or len(tokens)
    got = [h.hex() for h in orbitkv.sglang_page_hashes(tokens, page, prior=prior)]
    # The whole-sequence case is one hash, recorded as a string.
    expected = case["output"] if case["page_size"] else [case["output"]]
    assert got == expected


def test_hashes_equal_the_cli() -> None:
    tokens = list(range(100, 140))
    text = ",".join(map(str, tokens))
    for algo, seed in [("sha256_cbor", None), ("xxhash_cbor", "42")]:
        args = ["hash", "vllm", "--algo", algo, "--block-size", "16", "--tokens", text]
        if seed:
            args += ["--seed", seed]
        got = orbitkv.vllm_block_hashes(tokens, 16, algo=algo, seed=seed)  # type: ignore[arg-type]
        assert [h.hex() for h in got] == cli(*args)["hashes"]
    got = orbitkv.sglang_page_hashes(tokens, 16)
    assert [h.hex() for h in got] == cli("hash", "sglang", "--page-size", "16", "--tokens", text)[
        "hashes"
    ]
    with pytest.raises(orbitkv.InvalidInput):
        orbitkv.vllm_block_hashes(tokens, 16, algo="xxhash_cbor")


def resolve(
    model: Path, *, kv_cache_dtype: str = "fp8_e4m3", lora: bool = False
) -> orbitkv.Identity:
    """The identity of `model` under the settings FLAGS gives the CLI."""
    return orbitkv.resolve_identity(
        str(model),
        engine="vllm",
        release="0.33.0",
        dtype="bfloat16",
        kv_cache_dtype=kv_cache_dtype,
        quantization="none",
        attention_backend="FLASH_ATTN",
        cache_variant="paged",
        lora=lora,
    )


FLAGS = [
    "--engine", "vllm@0.33.0", "--dtype", "bfloat16", "--kv-dtype", "fp8_e4m3",
    "--quantization", "none", "--attention-backend", "FLASH_ATTN", "--cache-variant", "paged",
]  # fmt: skip


def model_dir(root: Path) -> Path:
    d = root / "model"
    d.mkdir()
    (d / "config.json").write_text('{"model_type": "llama", "num_hidden_layers": 2}')
    (d / "model.safetensors").write_bytes(os.urandom(1 << 16))
    return d


def test_identity_equals_the_cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ORBITKV_MODEL_FINGERPRINT", raising=False)
    monkeypatch.delenv("ORBITKV_CACHE_SCOPE", raising=False)
    d = model_dir(tmp_path)
    ident = resolve(d)
    expected = cli("identity", str(d), *FLAGS)
    assert ident.text == expected["identity"]
    assert ident.digest.hex() == expected["identity"].removeprefix("v1:")
    assert ident.model_digest_kind == "artifacts"
    assert ident.model_digest == expected["model_digest"]["digest"]
    assert ident.fields == [(f["name"], f["value"]) for f in expected["fields"]]
    # Any byte of the weights changes it.
    (d / "model.safetensors").write_bytes(os.urandom(1 << 16))
    assert resolve(d).text != ident.text

    # The operator's digest replaces reading the files; the scope stays out of the identity.
    digest = "ab" * 32
    env = {**os.environ, "ORBITKV_MODEL_FINGERPRINT": digest, "ORBITKV_CACHE_SCOPE": "tenant-a"}
    monkeypatch.setenv("ORBITKV_MODEL_FINGERPRINT", digest)
    monkeypatch.setenv("ORBITKV_CACHE_SCOPE", "tenant-a")
    ident = resolve(d)
    expected = cli("identity", str(d), *FLAGS, env=env)
    assert ident.text == expected["identity"]
    assert ident.model_digest_kind == "operator" and ident.scope == "tenant-a"


def test_identity_refuses_lora_and_a_missing_setting(tmp_path: Path) -> None:
    d = model_dir(tmp_path)
    with pytest.raises(orbitkv.InvalidInput) as e:
        resolve(d, lora=True)
    assert "LoRA" in str(e.value) or "lora" in str(e.value)
    with pytest.raises(TypeError):
        orbitkv.resolve_identity(str(d), engine="vllm")  # type: ignore[call-arg]
    with pytest.raises(orbitkv.InvalidInput):
        resolve(tmp_path / "absent")


@pytest.mark.parametrize(
    ("workers", "layers", "heads", "head_size", "placement"),
    [(1, 2, 1, 4, "page"), (2, 3, 2, 8, "layer"), (4, 2, 4, 16, "page")],
)
def test_layout_formats_and_pool_equal_the_cli(
    workers: int, layers: int, heads: int, head_size: int, placement: str, tmp_path: Path
) -> None:
    """The Rust simulated engine's registration (`engine-sim --print-registration`) and the
    same instance described from Python register the same bytes."""
    d = model_dir(tmp_path)
    flags = [
        "engine-sim", "--print-registration", "--model-dir", str(d), "--ranks", str(workers),
        "--layers", str(layers), "--kv-heads", str(heads), "--head-size", str(head_size),
        "--placement", placement, "--pool-pages", "8",
    ]  # fmt: skip
    expected = cli(*flags)
    engine = Engine(
        "x", workers=workers, layers=layers, kv_heads=heads, head_size=head_size,
        block_tokens=16, placement=placement,
    )  # fmt: skip
    assert engine.layout().encode().hex() == expected["layout"]
    assert engine.layout().digest().hex() == expected["layout_digest"]
    assert [[engine.format(r).encode().hex()] for r in range(workers)] == expected["formats"]
    spec = engine.spec(pool=1, pages=8)
    assert spec.page_bytes == expected["pool"]["page_bytes"]

    def placed(g: dict[str, object]) -> dict[str, object]:
        # A part stride is unused with one part.
        return {k: v for k, v in g.items() if not (k == "part_stride" and g["parts"] == 1)}

    got = [placed({k: getattr(g, k) for k in expected["pool"]["groups"][0]}) for g in spec.groups]
    assert got == [placed(g) for g in expected["pool"]["groups"]]
    ident = resolve(d, kv_cache_dtype="bfloat16")
    assert ident.digest.hex() == expected["identity"]
