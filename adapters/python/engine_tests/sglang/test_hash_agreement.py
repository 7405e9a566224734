"""The package's SGLang page hashes agree bit for bit with SGLang's own (`get_hash_str`, its
C++ extension), the keys the backend receives: from the root, after a prior page, and with the
storage namespace seed of `extra_key` / `cache_salt`."""

from __future__ import annotations

import orbitkv
import pytest
from sglang.srt.mem_cache.utils import get_hash_str, storage_namespace_seed

TOKENS = [(i * 131 + 17) % 32000 for i in range(100)]


@pytest.mark.parametrize("page", [1, 16, 64])
def test_page_hashes_agree(page: int) -> None:
    ours = [h.hex() for h in orbitkv.sglang_page_hashes(TOKENS, page)]
    # A last partial page is hashed too, by both.
    assert ours == get_hash_str(TOKENS, None, page_size=page)


def test_a_chain_after_a_prior_page_agrees() -> None:
    prior = get_hash_str(TOKENS[:16])
    assert isinstance(prior, str)
    ours = orbitkv.sglang_page_hashes(TOKENS[16:48], 16, prior=bytes.fromhex(prior))
    assert [h.hex() for h in ours] == get_hash_str(TOKENS[16:48], prior, page_size=16)


@pytest.mark.parametrize(
    ("extra_key", "cache_salt"), [("lora-7", None), (None, "tenant"), ("", ""), ("a", "b")]
)
def test_the_namespace_seed_agrees(extra_key: str | None, cache_salt: str | None) -> None:
    seed = orbitkv.sglang_namespace_seed(extra_key, cache_salt)
    expected = storage_namespace_seed(extra_key, cache_salt)
    assert seed is not None and seed.hex() == expected
    assert orbitkv.sglang_namespace_seed(None, None) is None
    chain = orbitkv.sglang_page_hashes(TOKENS[:32], 16, prior=seed)
    assert [h.hex() for h in chain] == get_hash_str(TOKENS[:32], expected, page_size=16)
