#!/usr/bin/env python3
"""Generate prefix-cache block-hash test vectors by running the engines' REAL code.

OrbitKV reimplements vLLM's and SGLang's prefix-cache block hashes bit-exactly.
This script does not reimplement anything on the engine side: it imports
vllm==0.33.0 and sglang==0.5.23 and calls their own hashing code, then writes
the inputs and outputs to ``engine_generated.json`` (beside this script) for the
Rust tests to compare against.

vLLM (vllm/v1/core/kv_cache_utils.py, vllm/utils/hashing.py):
  a real ``vllm.v1.request.Request`` (SamplingParams, LoRARequest, cache_salt,
  MultiModalFeatureSpec/PlaceholderRange, prompt_embeds tensor) is hashed by
  ``get_request_block_hasher(block_size, get_hash_fn_by_name(algo))`` after
  ``init_none_hash(hash_fn)`` ran with PYTHONHASHSEED set or unset in
  os.environ as the case requires.  Chain continuations (given parent hash,
  start_token > 0) call ``hash_block_tokens`` block by block with
  ``generate_block_hash_extra_keys``; they are cross-checked against the real
  request block hasher.  KV-event ints come from ``maybe_convert_block_hash``.
SGLang (sglang/srt/mem_cache/utils.py + cpp_utils/hash_binding.cpp):
  ``get_hash_str(token_ids, prior_hash_hex or storage_namespace_seed(...),
  page_size)`` and ``hash_str_to_int64``; the C++ extension is JIT-compiled by
  torch.utils.cpp_extension at first use (needs a C++ compiler, the OpenSSL
  headers/libcrypto, and ``ninja`` on PATH -- the script puts the interpreter's
  bin directory first on PATH).

Inputs the engines refuse are not written as vectors; they go to the top-level
"errors" list with the Python exception class name.

Install the engines (CPU is enough; PyPI torch is the CUDA build, whose nvidia-*
wheels are needed even on CPU), from the repository root:

    python3 -m venv .venv-engines
    .venv-engines/bin/pip install --no-cache-dir torch==2.14.0
    .venv-engines/bin/pip install --no-cache-dir --no-deps \
        -r state/tests/vectors/engines-requirements.txt

(unpinned, a newer transformers breaks vLLM's import).

Regenerate (from the repository root):

    .venv-engines/bin/python state/tests/vectors/generate.py --self-check

Options:
  --out PATH        where to write the JSON (default: engine_generated.json
                    beside this script)
  --self-check      before writing, validate every vector against an
                    independent pure-Python recomputation (own canonical-CBOR
                    encoder + cbor2 + hashlib/xxhash for vLLM; SHA-256 over
                    u32/u64 little-endian pages for SGLang)
  --reference PATH  also require that every vector of an older reference file
                    (same schema family, e.g. a shared engine_hashes.json) is
                    reproduced by an equivalent case here

VLLM_CACHE_ROOT, SGLANG_CACHE_DIR and TORCH_EXTENSIONS_DIR are pointed at fresh
temporary directories (removed at exit) unless already set.  The output is
deterministic: running twice gives identical bytes.
"""

import argparse
import atexit
import contextlib
import hashlib
import json
import os
import platform
import shutil
import struct
import sys
import tempfile

SCRIPT_REL = "state/tests/vectors/generate.py"
DEFAULT_SEED = "vllm-none-hash"  # vLLM's DEFAULT_NONE_HASH_SEED (sha256 only)
U64_MASK = (1 << 64) - 1


# --------------------------------------------------------------------------
# environment
# --------------------------------------------------------------------------


def prepare_environment():
    bindir = os.path.dirname(sys.executable)
    os.environ["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "")
    for var in ("VLLM_CACHE_ROOT", "SGLANG_CACHE_DIR", "TORCH_EXTENSIONS_DIR"):
        if not os.environ.get(var):
            d = tempfile.mkdtemp(prefix="orbitkv-vectors-")
            atexit.register(shutil.rmtree, d, True)
            os.environ[var] = d
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    import warnings

    warnings.filterwarnings("ignore")


@contextlib.contextmanager
def env_var(name, value):
    """Set (value is a str) or unset (value is None) an env var, then restore."""
    old = os.environ.get(name)
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


def import_engines():
    try:
        import torch  # noqa: F401
        import vllm  # noqa: F401
        import vllm.v1.core.kv_cache_utils  # noqa: F401
        from sglang.srt.mem_cache.utils import get_hash_str  # noqa: F401
    except Exception as exc:  # ImportError or a broken engine install
        sys.stderr.write(
            "error: vllm==0.33.0 and sglang==0.5.23 must be importable to "
            "generate the vectors (%s: %s).\nInstall them as described in the "
            "docstring of %s and run it with that interpreter, e.g.\n"
            "  .venv-engines/bin/python %s\n"
            % (type(exc).__name__, exc, SCRIPT_REL, SCRIPT_REL)
        )
        sys.exit(1)


def versions():
    from importlib import metadata

    return {
        "python": platform.python_version(),
        **{
            p: metadata.version(p)
            for p in ("vllm", "sglang", "torch", "cbor2", "xxhash")
        },
    }


# --------------------------------------------------------------------------
# case definitions
# --------------------------------------------------------------------------


def sha_hex(s):
    return hashlib.sha256(s.encode()).hexdigest()


IMG_A = sha_hex("image-a")
IMG_B = sha_hex("image-b")
IMG_C = sha_hex("image-c")
LONG_ID = "img-" + "0123456789abcdef" * 16 + "-end"  # 264 bytes: CBOR 0x79 length
UNI_ID = "画像-🖼-" + IMG_A[:16]
SALT_24 = "s" * 24  # smallest text with a 1-byte CBOR length (0x78 0x18)
SALT_23 = "t" * 23  # largest text with the length inline (0x77)
SALT_300 = "salt-" + "x" * 295  # 300 bytes: 2-byte CBOR length (0x79 0x012c)
LORA_LONG_NAME = "lora-" + "n" * 250  # 255 bytes (0x78 0xff)
LORA_LONG_PATH = "adapters/" + "p" * 247  # 256 bytes (0x79 0x0100)
SEED_300 = "seed-" + "z" * 295
UNI_SEED = "種子-🌱-seed"
UNI_SALT = "租户-é-🚀"
UNI_LORA = ("lora-ñ-日本", "adapters/日本語/ñ-🚀")
CBOR_BOUNDARY_TOKENS = [
    0, 23, 24, 255, 256, 65535, 65536, 2**32 - 1,
    2**32, 2**63 - 1, 2**64 - 1, 151645,
]
VOCAB_TOKENS = list(range(151640, 151660))  # Qwen-range ids (4-byte CBOR ints, 0x1a)


def rng(a, b):
    return list(range(a, b))


def vllm_cases():
    """Each case: inputs for one real Request / hash chain."""
    C = []

    def v(name, algo, seed, bs, tokens, salt=None, lora=None, mm=(), embeds=None,
          error=False):
        C.append(dict(name=name, algo=algo, seed=seed, block_size=bs,
                      tokens=list(tokens), cache_salt=salt, lora=lora,
                      mm=[tuple(m) for m in mm], embeds=embeds, cont=None,
                      error=error))

    def cont(name, ref, after_block):
        C.append(dict(name=name, cont=(ref, after_block), error=False))

    S, X = "sha256_cbor", "xxhash_cbor"
    # ---- plain chains, sha256 with PYTHONHASHSEED unset (default seed) ----
    v("sha256_unset_bs16_2blocks_tokens0_31", S, None, 16, rng(0, 32))  # = ref v1
    v("sha256_unset_bs16_2blocks_plus_partial8", S, None, 16, rng(0, 40))
    v("sha256_unset_bs16_1block", S, None, 16, rng(100, 116))
    v("sha256_unset_bs1_3blocks", S, None, 1, [7, 8, 9])
    v("sha256_unset_bs4_4blocks", S, None, 4, rng(1, 17))
    v("sha256_unset_bs4_3blocks_plus_partial2", S, None, 4, rng(1, 15))
    v("sha256_unset_bs4_cbor_int_boundaries", S, None, 4, CBOR_BOUNDARY_TOKENS)
    v("sha256_unset_bs1_cbor_int_boundaries", S, None, 1, CBOR_BOUNDARY_TOKENS)
    v("sha256_unset_bs16_vocab_ids_plus_partial4", S, None, 16, VOCAB_TOKENS)
    # ---- seeds ----
    v("sha256_seed0_bs16_2blocks", S, "0", 16, rng(0, 32))
    v("sha256_seed42_bs4_3blocks", S, "42", 4, rng(0, 12))
    v("sha256_seed_empty_string_bs4_2blocks", S, "", 4, rng(0, 8))
    v("sha256_seed_unicode_bs4_2blocks", S, UNI_SEED, 4, rng(0, 8))
    v("sha256_seed_300_bytes_bs4_1block", S, SEED_300, 4, rng(0, 4))
    v("sha256_seed_equals_default_string_bs4", S, DEFAULT_SEED, 4, rng(0, 8))
    v("xxhash_seed42_bs16_2blocks_tokens0_31", X, "42", 16, rng(0, 32))  # = ref v5
    v("xxhash_seed0_bs4_cbor_int_boundaries", X, "0", 4, CBOR_BOUNDARY_TOKENS)
    v("xxhash_seed_empty_string_bs4_2blocks", X, "", 4, rng(0, 8))
    v("xxhash_seed_unicode_bs1_4blocks", X, UNI_SEED, 1, [1, 2, 3, 4])
    v("xxhash_seed42_bs4_2blocks_plus_partial3", X, "42", 4, rng(0, 11))
    # ---- cache_salt ----
    v("sha256_unset_bs4_salt", S, None, 4, rng(0, 8), salt="tenant-A")
    v("sha256_unset_bs4_salt_empty_string_is_ignored", S, None, 4, rng(0, 8),
      salt="")
    v("sha256_unset_bs4_salt_unicode", S, None, 4, rng(0, 8), salt=UNI_SALT)
    v("sha256_unset_bs4_salt_23_bytes", S, None, 4, rng(0, 4), salt=SALT_23)
    v("sha256_unset_bs4_salt_24_bytes", S, None, 4, rng(0, 4), salt=SALT_24)
    v("sha256_unset_bs4_salt_300_bytes", S, None, 4, rng(0, 8), salt=SALT_300)
    v("xxhash_seed42_bs4_salt", X, "42", 4, rng(0, 8), salt="tenant-A")
    # ---- LoRA ----
    v("sha256_unset_bs4_lora", S, None, 4, rng(0, 8),
      lora=("sql-lora", "adapters/sql-lora"))
    v("sha256_unset_bs4_lora_unicode", S, None, 4, rng(0, 8), lora=UNI_LORA)
    v("sha256_unset_bs4_lora_empty_name", S, None, 4, rng(0, 4),
      lora=("", "adapters/unnamed"))
    v("sha256_unset_bs4_lora_long_name_and_path", S, None, 4, rng(0, 8),
      lora=(LORA_LONG_NAME, LORA_LONG_PATH))
    v("sha256_seed42_bs4_lora_and_salt", S, "42", 4, rng(0, 12),
      salt="tenant-B", lora=("sql-lora", "adapters/sql-lora"))
    v("xxhash_seed0_bs4_lora_and_salt_unicode", X, "0", 4, rng(0, 8),
      salt=UNI_SALT, lora=UNI_LORA)
    v("sha256_unset_bs4_lora_empty_path_refused", S, None, 4, rng(0, 4),
      lora=("sql-lora", ""), error=True)
    # ---- multimodal ----
    v("sha256_unset_bs16_mm_one_item_inside_block0", S, None, 16, rng(0, 32),
      mm=[(IMG_A, 3, 5)])
    v("sha256_unset_bs4_mm_item_spans_blocks0_2_negative_offsets", S, None, 4,
      rng(0, 16), mm=[(IMG_A, 2, 8)])
    v("sha256_unset_bs8_mm_two_items_in_block0", S, None, 8, rng(0, 16),
      mm=[(IMG_A, 1, 2), (IMG_B, 4, 3)])
    v("sha256_unset_bs4_mm_item_exactly_one_block_at_boundary", S, None, 4,
      rng(0, 12), mm=[(IMG_A, 4, 4)])
    v("sha256_unset_bs4_mm_item_starts_at_boundary_spans_2", S, None, 4,
      rng(0, 12), mm=[(IMG_A, 4, 6)])
    v("sha256_unset_bs4_mm_three_items_across_blocks", S, None, 4, rng(0, 16),
      mm=[(IMG_A, 0, 3), (IMG_B, 3, 6), (IMG_C, 12, 4)])
    v("sha256_unset_bs4_mm_item_only_in_partial_block", S, None, 4, rng(0, 10),
      mm=[(IMG_A, 8, 2)])
    v("sha256_unset_bs4_mm_long_and_unicode_identifiers", S, None, 4,
      rng(0, 12), mm=[(LONG_ID, 1, 2), (UNI_ID, 5, 4)])
    v("sha256_seed42_bs4_mm_lora_salt", S, "42", 4, rng(0, 12),
      salt="tenant-C", lora=("vision-lora", "adapters/vision"),
      mm=[(IMG_A, 2, 5)])
    v("xxhash_seed_unicode_bs4_mm_lora_salt", X, UNI_SEED, 4, rng(0, 12),
      salt=UNI_SALT, lora=UNI_LORA, mm=[(UNI_ID, 2, 7)])
    v("sha256_unset_bs1_mm_item_len3", S, None, 1, rng(0, 5),
      mm=[(IMG_B, 1, 3)])
    # ---- prompt embeds (float32 torch.arange(n*4).reshape(n, 4) / 8 - 1) ----
    v("sha256_unset_bs4_prompt_embeds_no_token_ids", S, None, 4, [0] * 8,
      embeds=dict(mode="no_ids", dim=4))
    v("sha256_unset_bs4_prompt_embeds_with_token_ids_plus_partial2", S, None, 4,
      rng(10, 20), embeds=dict(mode="ids", dim=4))
    v("sha256_unset_bs4_prompt_embeds_mixed_mode_masked_ids", S, None, 4,
      [501, 502, 503, 504, 505, 506, 507, 508],
      embeds=dict(mode="mixed", dim=4,
                  is_token_ids=[True, True, False, False, False, True, True, True]))
    v("sha256_seed42_bs4_prompt_embeds_lora_salt", S, "42", 4, [0] * 8,
      salt="tenant-D", lora=("sql-lora", "adapters/sql-lora"),
      embeds=dict(mode="no_ids", dim=4))
    v("xxhash_seed42_bs4_prompt_embeds_no_token_ids", X, "42", 4, [0] * 8,
      embeds=dict(mode="no_ids", dim=4))
    # ---- chain continuation (parent given, start_token > 0) ----
    cont("sha256_unset_bs4_continue_after_block0", "sha256_unset_bs4_4blocks", 0)
    cont("sha256_unset_bs4_continue_after_block1_boundaries",
         "sha256_unset_bs4_cbor_int_boundaries", 1)
    cont("sha256_unset_bs4_continue_lora_long", "sha256_unset_bs4_lora_long_name_and_path", 0)
    cont("sha256_unset_bs4_continue_of_salted_chain",
         "sha256_unset_bs4_salt_300_bytes", 0)
    cont("sha256_unset_bs4_continue_inside_mm_item_negative_offset",
         "sha256_unset_bs4_mm_item_spans_blocks0_2_negative_offsets", 0)
    cont("sha256_seed42_bs4_continue_mm_lora",
         "sha256_seed42_bs4_mm_lora_salt", 0)
    cont("xxhash_seed42_bs4_continue_plus_partial",
         "xxhash_seed42_bs4_2blocks_plus_partial3", 0)
    return C


def sglang_cases():
    C = []

    def s(name, tokens, page_size, prior=None, extra_key=None, cache_salt=None,
          error=False):
        C.append(dict(name=name, token_ids=list(tokens), page_size=page_size,
                      prior_hash_hex=prior, extra_key=extra_key,
                      cache_salt=cache_salt, error=error))

    P1 = sha_hex("orbitkv-prior-1")
    P2 = "ff" * 32
    W = 2**32
    s("page4_no_prior_tokens0_15", rng(0, 16), 4)  # = ref s1
    s("whole_sequence_1_5", [1, 2, 3, 4, 5], None)  # = ref s3
    s("page4_extra_key_and_salt", rng(0, 8), 4, extra_key="lora-7",
      cache_salt="tenant-A")  # = ref s6
    s("page1_3pages", [5, 6, 7], 1)
    s("page2_4pages", rng(0, 8), 2)
    s("page2_4pages_plus_partial1", rng(0, 9), 2)
    s("page4_4pages_plus_partial2", rng(0, 18), 4)
    s("page16_2pages", rng(0, 32), 16)
    s("page16_2pages_plus_partial8", rng(0, 40), 16)
    s("page64_2pages", rng(0, 128), 64)
    s("page64_1page_plus_partial36", rng(0, 100), 64)
    s("page16_shorter_than_one_page", rng(0, 5), 16)
    s("page4_vocab_ids", VOCAB_TOKENS, 4)
    s("empty_whole_sequence", [], None)
    s("empty_page4", [], 4)
    s("empty_whole_sequence_with_prior", [], None, prior=P1)
    s("empty_page4_with_namespace", [], 4, extra_key="k")
    s("page4_prior", rng(0, 12), 4, prior=P1)
    s("page4_prior_all_ff", rng(0, 8), 4, prior=P2)
    s("whole_sequence_prior", [1, 2, 3, 4, 5], None, prior=P1)
    s("page4_prior_empty_string_means_no_prior", rng(0, 8), 4, prior="")
    s("page4_prior_wins_over_namespace", rng(0, 8), 4, prior=P1,
      extra_key="lora-7", cache_salt="tenant-A")
    s("page4_extra_key_only", rng(0, 8), 4, extra_key="lora-7")
    s("page4_cache_salt_only", rng(0, 8), 4, cache_salt="tenant-A")
    s("page4_extra_key_empty_string", rng(0, 8), 4, extra_key="")
    s("page4_cache_salt_empty_string", rng(0, 8), 4, cache_salt="")
    s("page4_extra_key_and_salt_both_empty", rng(0, 8), 4, extra_key="",
      cache_salt="")
    s("page4_namespace_join_ambiguity_a", rng(0, 4), 4, extra_key="ab",
      cache_salt="c")
    s("page4_namespace_join_ambiguity_b", rng(0, 4), 4, extra_key="a",
      cache_salt="bc")
    s("page4_namespace_unicode", rng(0, 8), 4, extra_key=UNI_LORA[0],
      cache_salt=UNI_SALT)
    s("whole_sequence_namespace", [1, 2, 3, 4, 5], None, extra_key="lora-7",
      cache_salt="tenant-A")
    s("page4_wide_token_in_page1_only", [1, 2, 3, 4, 5, W, 7, 8, 9, 10, 11, 12], 4)
    s("page4_wide_token_in_partial_page", [1, 2, 3, 4, 5, 6, 7, 8, W + 9], 4)
    s("page2_boundary_u32_max_narrow", [W - 1, 0, W - 1, W - 1], 2)
    s("page2_boundary_2pow32_wide", [W - 1, W, 1, 2], 2)
    s("page2_boundary_i64_max_wide", [2**63 - 1, 0, 3, 4], 2)
    s("whole_sequence_wide", [1, W, 3], None)
    s("whole_sequence_u32_max_narrow", [0, W - 1, 2], None)
    s("whole_sequence_i64_max", [2**63 - 1], None)
    s("page4_prior_and_wide", [1, 2, 3, 4, W, 6, 7, 8], 4, prior=P1)
    s("whole_sequence_prior_and_wide", [W + 1, 2], None, prior=P1)
    s("page4_namespace_and_wide", [1, 2, W, 4, 5, 6, 7, 8], 4, extra_key="lora-7")
    # ---- refused by the engine ----
    s("page2_token_2pow63_refused", [1, 2**63], 2, error=True)
    s("whole_sequence_token_u64_max_refused", [2**64 - 1], None, error=True)
    s("page2_negative_token_refused", [1, -1], 2, error=True)
    s("whole_sequence_negative_token_refused", [-1], None, error=True)
    s("page_size_0_refused", [1, 2], 0, error=True)
    s("page_size_negative_refused", [1, 2], -1, error=True)
    s("prior_wrong_length_refused", [1, 2], 2, prior="abcd", error=True)
    s("prior_not_hex_refused", [1, 2], 2, prior="zz" * 32, error=True)
    return C


# --------------------------------------------------------------------------
# vLLM: run the real code
# --------------------------------------------------------------------------


def embeds_values(n_rows, dim):
    """The float32 prompt embeds used by the cases, as python floats."""
    return [i / 8 - 1 for i in range(n_rows * dim)]


def make_embeds_tensor(n_rows, dim):
    import torch

    return torch.arange(n_rows * dim, dtype=torch.float32).reshape(n_rows, dim) / 8 - 1


def build_request(case, prompt_ids, block_hasher):
    import torch  # noqa: F401
    from vllm.lora.request import LoRARequest
    from vllm.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange
    from vllm.sampling_params import SamplingParams
    from vllm.v1.request import Request

    lora = None
    if case["lora"] is not None:
        lora = LoRARequest(lora_name=case["lora"][0], lora_int_id=1,
                           lora_path=case["lora"][1])
    mm = [
        MultiModalFeatureSpec(data=None, modality="image", identifier=ident,
                              mm_position=PlaceholderRange(offset=off, length=ln))
        for ident, off, ln in case["mm"]
    ]
    kwargs = {}
    e = case.get("embeds")
    if e is not None:
        kwargs["prompt_embeds"] = make_embeds_tensor(len(prompt_ids), e["dim"])
        if e["mode"] == "no_ids":
            prompt_ids = None
        elif e["mode"] == "mixed":
            kwargs["prompt_is_token_ids"] = list(e["is_token_ids"])
    return Request(
        request_id="orbitkv-" + case["name"],
        prompt_token_ids=None if prompt_ids is None else list(prompt_ids),
        sampling_params=SamplingParams(max_tokens=1),
        pooling_params=None,
        arrival_time=0.0,
        mm_features=mm or None,
        lora_request=lora,
        cache_salt=case["cache_salt"],
        block_hasher=block_hasher,
        **kwargs,
    )


def vllm_input_fields(case, start_token=0, parent_hex=None, token_ids=None):
    return {
        "algo": case["algo"],
        "seed": case["seed"],
        "block_size": case["block_size"],
        "start_token": start_token,
        "parent_hex": parent_hex,
        "token_ids": list(case["tokens"] if token_ids is None else token_ids),
        "cache_salt": case["cache_salt"],
        "lora": None if case["lora"] is None
        else {"name": case["lora"][0], "path": case["lora"][1]},
        "mm": [{"identifier": i, "offset": o, "length": n} for i, o, n in case["mm"]],
    }


def run_vllm(cases):
    import cbor2
    import vllm.v1.core.kv_cache_utils as kvu
    from vllm.utils.hashing import get_hash_fn_by_name

    vectors, errors, by_name = [], [], {}
    for case in cases:
        if case["cont"] is not None:
            vectors.append(run_vllm_continuation(case, by_name))
            continue
        algo, seed, bs = case["algo"], case["seed"], case["block_size"]
        if seed is None and algo != "sha256_cbor":
            raise SystemExit("case %s: unset seed only for sha256_cbor" % case["name"])
        hash_fn = get_hash_fn_by_name(algo)
        with env_var("PYTHONHASHSEED", seed), \
                env_var("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", "1"):
            kvu.init_none_hash(hash_fn)
            expected_seed = DEFAULT_SEED if seed is None else seed
            assert kvu.get_none_hash_seed() == expected_seed, case["name"]
            none_hash = bytes(kvu.NONE_HASH)
            try:
                req = build_request(case, case["tokens"],
                                    kvu.get_request_block_hasher(bs, hash_fn))
            except Exception as exc:
                if not case["error"]:
                    raise
                errors.append({"engine": "vllm", "name": case["name"],
                               "input": vllm_input_fields(case),
                               "error_type": type(exc).__name__})
                continue
            if case["error"]:
                raise SystemExit("case %s was expected to be refused" % case["name"])
            hashes = [bytes(h) for h in req.block_hashes]
            token_ids = list(req.all_token_ids)
            n_full = len(token_ids) // bs
            assert len(hashes) == n_full >= 1, case["name"]
            extra0, _ = kvu.generate_block_hash_extra_keys(req, 0, bs, 0)
            ser0 = cbor2.dumps((none_hash, tuple(token_ids[:bs]), extra0),
                               canonical=True)
            assert hash_fn((none_hash, tuple(token_ids[:bs]), extra0)) == hashes[0]
            digests = None
            if case["embeds"] is not None:
                cache = req._prompt_embeds_per_block_hashes
                ranges = [(i * bs, (i + 1) * bs) for i in range(n_full)]
                assert sorted(cache) == ranges, (case["name"], sorted(cache))
                digests = [cache[r].hex() for r in ranges]
            ints = [kvu.maybe_convert_block_hash(h) for h in hashes]
            assert all(isinstance(i, int) for i in ints)
        vec = vllm_input_fields(case, token_ids=token_ids)
        vec.update({
            "name": case["name"],
            "none_hash_hex": none_hash.hex(),
            "prompt_embeds_block_digests_hex": digests,
            "serialized_block0_hex": ser0.hex(),
            "block_hashes_hex": [h.hex() for h in hashes],
            "kv_event_int_hashes": ints,
        })
        by_name[case["name"]] = (case, vec)
        vectors.append(vec)
    return vectors, errors


def run_vllm_continuation(case, by_name):
    import cbor2
    import vllm.v1.core.kv_cache_utils as kvu
    from vllm.utils.hashing import get_hash_fn_by_name

    ref_name, after = case["cont"]
    ref_case, ref_vec = by_name[ref_name]
    assert ref_case["embeds"] is None
    bs = ref_case["block_size"]
    start = (after + 1) * bs
    tokens = ref_vec["token_ids"][start:]
    parent = bytes.fromhex(ref_vec["block_hashes_hex"][after])
    c = dict(ref_case, name=case["name"], cache_salt=None, tokens=tokens, embeds=None)
    hash_fn = get_hash_fn_by_name(c["algo"])
    with env_var("PYTHONHASHSEED", c["seed"]), \
            env_var("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", "1"):
        kvu.init_none_hash(hash_fn)
        none_hash = bytes(kvu.NONE_HASH)
        # Token ids before start_token do not enter the extra keys; the request
        # only needs absolute positions for mm offsets.
        full_ids = [0] * start + tokens
        req = build_request(c, full_ids, None)
        hashes, extras = [], []
        prev, mm_idx = parent, 0
        for s in range(start, start + (len(tokens) // bs) * bs, bs):
            extra, mm_idx = kvu.generate_block_hash_extra_keys(req, s, s + bs, mm_idx)
            h = bytes(kvu.hash_block_tokens(hash_fn, prev, full_ids[s:s + bs], extra))
            hashes.append(h)
            extras.append(extra)
            prev = h
        assert hashes, case["name"]
        # Cross-check with the real request block hasher resumed at `start`.
        req2 = build_request(c, full_ids, None)
        req2.block_hashes = [b"\0" * len(parent)] * after + [parent]
        again = kvu.get_request_block_hasher(bs, hash_fn)(req2)
        assert [bytes(h) for h in again] == hashes, case["name"]
        ser0 = cbor2.dumps((parent, tuple(tokens[:bs]), extras[0]), canonical=True)
        ints = [kvu.maybe_convert_block_hash(h) for h in hashes]
    vec = vllm_input_fields(c, start_token=start, parent_hex=parent.hex(),
                            token_ids=tokens)
    vec.update({
        "name": case["name"],
        "none_hash_hex": none_hash.hex(),
        "prompt_embeds_block_digests_hex": None,
        "serialized_block0_hex": ser0.hex(),
        "block_hashes_hex": [h.hex() for h in hashes],
        "kv_event_int_hashes": ints,
    })
    # The continuation must reproduce the tail of the chain it continues.
    assert vec["block_hashes_hex"] == ref_vec["block_hashes_hex"][after + 1:], case["name"]
    return vec


# --------------------------------------------------------------------------
# SGLang: run the real code
# --------------------------------------------------------------------------


def run_sglang(cases):
    from sglang.srt.mem_cache.utils import (
        get_hash_str,
        hash_str_to_int64,
        storage_namespace_seed,
    )

    vectors, errors = [], []
    for case in cases:
        inp = {k: case[k] for k in
               ("token_ids", "page_size", "prior_hash_hex", "extra_key", "cache_salt")}
        try:
            ns = storage_namespace_seed(case["extra_key"], case["cache_salt"])
            prior = case["prior_hash_hex"] if case["prior_hash_hex"] is not None else ns
            out = get_hash_str(list(case["token_ids"]), prior, case["page_size"])
            ev = ([hash_str_to_int64(h) for h in out] if isinstance(out, list)
                  else hash_str_to_int64(out))
        except Exception as exc:
            if not case["error"]:
                raise
            errors.append({"engine": "sglang", "name": case["name"], "input": inp,
                           "error_type": type(exc).__name__})
            continue
        if case["error"]:
            raise SystemExit("case %s was expected to be refused" % case["name"])
        assert isinstance(out, list) == (case["page_size"] is not None)
        vec = dict(inp, name=case["name"], namespace_seed_hex=ns, output=out,
                   event_int64=ev)
        vectors.append(vec)
    return vectors, errors


# --------------------------------------------------------------------------
# independent pure-Python recomputation (--self-check)
# --------------------------------------------------------------------------


def cbor_head(major, n):
    if n < 24:
        return bytes([major << 5 | n])
    for ai, width in ((24, 1), (25, 2), (26, 4), (27, 8)):
        if n < 1 << (8 * width):
            return bytes([major << 5 | ai]) + n.to_bytes(width, "big")
    raise ValueError("integer does not fit in 64 bits: %d" % n)


def cbor_encode(obj):
    """Minimal canonical CBOR (RFC 8949 core deterministic) for vLLM's keys."""
    if obj is None:
        return b"\xf6"
    if isinstance(obj, bool):
        return b"\xf5" if obj else b"\xf4"
    if isinstance(obj, int):
        return cbor_head(0, obj) if obj >= 0 else cbor_head(1, -1 - obj)
    if isinstance(obj, (bytes, bytearray)):
        return cbor_head(2, len(obj)) + bytes(obj)
    if isinstance(obj, str):
        b = obj.encode("utf-8")
        return cbor_head(3, len(b)) + b
    if isinstance(obj, (tuple, list)):
        return cbor_head(4, len(obj)) + b"".join(cbor_encode(x) for x in obj)
    raise TypeError(type(obj))


def ref_hash(algo, data):
    if algo == "sha256_cbor":
        return hashlib.sha256(data).digest()
    if algo == "xxhash_cbor":
        import xxhash

        return xxhash.xxh3_128_digest(data)
    raise ValueError(algo)


def check_vllm_vector(vec, embeds_spec):
    import cbor2

    algo, bs = vec["algo"], vec["block_size"]
    if vec["seed"] is None:
        assert algo == "sha256_cbor", "unset seed is random for " + algo
        seed = DEFAULT_SEED
    else:
        seed = vec["seed"]
    none_hash = ref_hash(algo, cbor_encode(seed))
    assert cbor_encode(seed) == cbor2.dumps(seed, canonical=True)
    assert none_hash.hex() == vec["none_hash_hex"], "none hash"
    toks = vec["token_ids"]
    n_full = len(toks) // bs
    assert len(vec["block_hashes_hex"]) == n_full, "block count"
    mm = [(m["identifier"], m["offset"], m["length"]) for m in vec["mm"]]
    assert mm == sorted(mm, key=lambda m: m[1]), "mm sorted"
    for a, b in zip(mm, mm[1:]):
        assert a[1] + a[2] <= b[1], "mm overlap"
    digests = None
    if embeds_spec is not None:
        vals = embeds_values(len(toks), embeds_spec["dim"])
        d = embeds_spec["dim"]
        digests = [
            hashlib.sha256(struct.pack("<%df" % (bs * d),
                                       *vals[i * bs * d:(i + 1) * bs * d])).hexdigest()
            for i in range(n_full)
        ]
        assert digests == vec["prompt_embeds_block_digests_hex"], "embeds digests"
    else:
        assert vec["prompt_embeds_block_digests_hex"] is None
    parent = (bytes.fromhex(vec["parent_hex"]) if vec["parent_hex"] is not None
              else none_hash)
    assert (vec["parent_hex"] is None) == (vec["start_token"] == 0)
    for i in range(n_full):
        s = vec["start_token"] + i * bs
        e = s + bs
        keys = []
        if vec["lora"] is not None:
            keys.append(("lora", vec["lora"]["name"], vec["lora"]["path"]))
        for ident, off, ln in mm:
            if off < e and off + ln > s:
                keys.append(("mm", ident, off - s))
        if s == 0 and vec["cache_salt"]:
            keys.append(("cache_salt", vec["cache_salt"]))
        if digests is not None:
            keys.append(("prompt_embeds", bytes.fromhex(digests[i])))
        extra = tuple(keys) if keys else None
        block = (parent, tuple(toks[i * bs:(i + 1) * bs]), extra)
        ser = cbor_encode(block)
        assert ser == cbor2.dumps(block, canonical=True), "own CBOR vs cbor2"
        if i == 0:
            assert ser.hex() == vec["serialized_block0_hex"], "serialized block 0"
        h = ref_hash(algo, ser)
        assert h.hex() == vec["block_hashes_hex"][i], "block %d hash" % i
        assert int.from_bytes(h, "big") & U64_MASK == vec["kv_event_int_hashes"][i]
        parent = h


def sglang_namespace(extra_key, cache_salt):
    if extra_key is None and cache_salt is None:
        return None
    buf = b"sglang-cache-namespace-v1"
    for part in (extra_key, cache_salt):
        if part is None:
            buf += b"\x00"
        else:
            b = part.encode("utf-8")
            buf += b"\x01" + struct.pack("<Q", len(b)) + b
    return hashlib.sha256(buf).hexdigest()


def sglang_page(prior, tokens):
    if any(t >= 2**32 for t in tokens):
        data = b"\xff" + b"".join(struct.pack("<Q", t) for t in tokens)
    else:
        data = b"".join(struct.pack("<I", t) for t in tokens)
    return hashlib.sha256((prior or b"") + data).digest()


def check_sglang_vector(vec):
    ns = sglang_namespace(vec["extra_key"], vec["cache_salt"])
    assert ns == vec["namespace_seed_hex"], "namespace seed"
    seed_hex = vec["prior_hash_hex"] if vec["prior_hash_hex"] is not None else ns
    prior = bytes.fromhex(seed_hex) if seed_hex else None  # "" means no prior
    toks, ps = vec["token_ids"], vec["page_size"]
    for t in toks:
        assert 0 <= t < 2**63
    if ps is None:
        want = sglang_page(prior, toks).hex()
    else:
        want = []
        for i in range(0, len(toks), ps):
            prior = sglang_page(prior, toks[i:i + ps])
            want.append(prior.hex())
    assert want == vec["output"], "output"

    def i64(h):
        u = int(h[:16], 16)
        return u - 2**64 if u >= 2**63 else u

    ev = [i64(h) for h in want] if ps is not None else i64(want)
    assert ev == vec["event_int64"], "event_int64"


def self_check(doc, vcases):
    embeds = {c["name"]: c.get("embeds") for c in vcases if c["cont"] is None}
    n = 0
    for vec in doc["vllm"]:
        try:
            check_vllm_vector(vec, embeds.get(vec["name"]))
        except AssertionError as exc:
            raise SystemExit("self-check failed for vllm %s: %s" % (vec["name"], exc))
        n += 1
    for vec in doc["sglang"]:
        try:
            check_sglang_vector(vec)
        except AssertionError as exc:
            raise SystemExit("self-check failed for sglang %s: %s" % (vec["name"], exc))
        n += 1
    names = [v["name"] for v in doc["vllm"]] + [v["name"] for v in doc["sglang"]]
    names += [e["name"] for e in doc["errors"]]
    assert len(names) == len(set(names)), "duplicate case names"
    print("self-check: %d vectors recomputed independently, all match" % n)


def reference_check(doc, path):
    with open(path, encoding="utf-8") as f:
        ref = json.load(f)
    missing = []
    vkeys = ("block_size", "token_ids", "cache_salt", "lora")
    for r in ref.get("vllm", []):
        seed = r["seed"] if "seed" in r else r.get("PYTHONHASHSEED")
        hit = [v for v in doc["vllm"]
               if v["algo"] == r["algo"] and v["seed"] == seed
               and all(v[k] == r.get(k) for k in vkeys)
               and v["mm"] == r.get("mm", []) and v["parent_hex"] is None
               and v["prompt_embeds_block_digests_hex"] is None
               and all(v[k] == r[k] for k in ("none_hash_hex", "serialized_block0_hex",
                                              "block_hashes_hex", "kv_event_int_hashes"))]
        if not hit:
            missing.append("vllm " + r["name"])
        else:
            print("reference %s reproduced by %s" % (r["name"], hit[0]["name"]))
    skeys = ("token_ids", "page_size", "prior_hash_hex", "extra_key", "cache_salt",
             "namespace_seed_hex", "output", "event_int64")
    for r in ref.get("sglang", []):
        hit = [v for v in doc["sglang"] if all(v[k] == r.get(k) for k in skeys)]
        if not hit:
            missing.append("sglang " + r["name"])
        else:
            print("reference %s reproduced by %s" % (r["name"], hit[0]["name"]))
    if missing:
        raise SystemExit("reference vectors not reproduced: " + ", ".join(missing))


# --------------------------------------------------------------------------


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.path.join(here, "engine_generated.json"))
    ap.add_argument("--self-check", action="store_true")
    ap.add_argument("--reference", metavar="PATH")
    args = ap.parse_args()

    prepare_environment()
    import_engines()
    ver = versions()

    vcases, scases = vllm_cases(), sglang_cases()
    vvec, verr = run_vllm(vcases)
    svec, serr = run_sglang(scases)
    doc = {
        "about": (
            "Block hashes produced by the engines' own code, run unmodified: "
            "vllm==%(vllm)s (vllm/v1/core/kv_cache_utils.py init_none_hash, "
            "get_request_block_hasher, hash_block_tokens, "
            "generate_block_hash_extra_keys, maybe_convert_block_hash on real "
            "Request objects; vllm/utils/hashing.py sha256_cbor, xxhash_cbor) and "
            "sglang==%(sglang)s (srt/mem_cache/utils.py get_hash_str, "
            "storage_namespace_seed, hash_str_to_int64 over "
            "cpp_utils/hash_binding.cpp), with Python %(python)s, torch %(torch)s, "
            "cbor2 %(cbor2)s, xxhash %(xxhash)s; generated by " % ver
        ) + SCRIPT_REL + ".",
        "vllm": sorted(vvec, key=lambda v: v["name"]),
        "sglang": sorted(svec, key=lambda v: v["name"]),
        "errors": sorted(verr + serr, key=lambda e: (e["engine"], e["name"])),
    }
    text = json.dumps(doc, indent=1, sort_keys=True, ensure_ascii=False) + "\n"
    doc = json.loads(text)  # checks run on exactly what is written
    if args.self_check:
        self_check(doc, vcases)
    if args.reference:
        reference_check(doc, args.reference)
    with open(args.out, "w", encoding="utf-8", newline="\n") as f:
        f.write(text)
    print("wrote %d vLLM vectors, %d SGLang vectors, %d refused inputs to %s (%d bytes)"
          % (len(doc["vllm"]), len(doc["sglang"]), len(doc["errors"]),
             os.path.relpath(args.out), len(text.encode("utf-8"))))


if __name__ == "__main__":
    main()
