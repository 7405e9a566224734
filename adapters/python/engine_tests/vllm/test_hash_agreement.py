"""The package's vLLM hashes agree bit for bit with `Request.block_hashes` (the hashes the
connector passes through): sha256_cbor, and xxhash_cbor with a seed, at the block size and at a
hash block size smaller than it."""

from __future__ import annotations

import orbitkv
import pytest
from vllm import SamplingParams
from vllm.utils.hashing import get_hash_fn_by_name
from vllm.v1.core import kv_cache_utils
from vllm.v1.request import Request

TOKENS = [(i * 131 + 17) % 32000 for i in range(100)]


@pytest.mark.parametrize("algo", ["sha256_cbor", "xxhash_cbor"])
@pytest.mark.parametrize("hash_block", [16, 8])
def test_block_hashes_agree(algo: str, hash_block: int, monkeypatch: pytest.MonkeyPatch) -> None:
    if algo == "xxhash_cbor":
        pytest.importorskip("xxhash")
    monkeypatch.setenv("PYTHONHASHSEED", "1234")
    fn = get_hash_fn_by_name(algo)
    kv_cache_utils.init_none_hash(fn)
    hasher = kv_cache_utils.get_request_block_hasher(hash_block, fn)
    r = Request(
        request_id="r",
        prompt_token_ids=TOKENS,
        sampling_params=SamplingParams(max_tokens=1),
        pooling_params=None,
        block_hasher=hasher,
    )
    ours = orbitkv.vllm_block_hashes(TOKENS, hash_block, algo=algo, seed="1234")  # type: ignore[arg-type]
    assert [bytes(h) for h in r.block_hashes] == ours
