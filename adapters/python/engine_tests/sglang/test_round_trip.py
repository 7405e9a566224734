"""`batch_set_v1` → `batch_exists` → `batch_get_v1` through the daemon over SGLang's real host
pools (shared memory, registered in place): what one server stores, a second server of the same
computation with a host pool of another size reads back byte-exact; every other computation
sees nothing."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import orbitkv
import pytest
from daemon import Daemon
from harness import PAGE, Rank, same_bytes

TOKENS = [(i * 37 + 11) % 1000 for i in range(4 * PAGE)]


def test_a_second_server_reads_back_what_the_first_stored(daemon: Daemon, model_dir: Path) -> None:
    a = Rank(model_dir, "writer", daemon.socket)
    keys, data = a.publish(TOKENS)
    assert a.exists(keys) == 4
    b = Rank(model_dir, "reader", daemon.socket, ratio=3.0)
    assert b.host.size != a.host.size, "host pools of different sizes"
    assert b.exists(keys) == 4
    done, loaded = b.get(keys)
    assert done == [True] * 4
    assert same_bytes(loaded, data), "byte-exact"
    # The tail alone, after the pages the caller holds already.
    assert b.exists(keys[2:], prefix=keys[:2]) == 2
    done, tail = b.get(keys[2:], prefix=keys[:2])
    assert done == [True, True]
    assert same_bytes(tail, data[:, :, 2 * PAGE :])
    assert b.backend.counters()["loaded_pages"] == 6
    a.close()
    b.close()


def test_data_parallel_ranks_are_instances_sharing_records(daemon: Daemon, model_dir: Path) -> None:
    """Each data-parallel rank of one server is an instance of its own (named by the server's
    port and its rank), and they share records: the same computation."""
    tokens = [t + 5 for t in TOKENS]
    dp = [Rank(model_dir, None, daemon.socket, dp_rank=r, args={"port": 30123}) for r in range(2)]
    try:
        assert [r.backend.s.instance for r in dp] == ["sglang-30123-dp0", "sglang-30123-dp1"]
        keys, data = dp[0].publish(tokens)
        done, loaded = dp[1].get(keys)
        assert done == [True] * 4 and same_bytes(loaded, data)
    finally:
        for r in dp:
            r.close()


def test_a_chain_longer_than_a_query_may_name_is_asked_for_its_leading_part(
    daemon: Daemon, model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The daemon refuses a Query of more than `MAX_QUERY_BLOCKS` hashes: the chain's leading
    part within the limit is asked for instead, a prefix the daemon can prove."""
    tokens = [t + 3 for t in TOKENS]
    a = Rank(model_dir, "long-chain", daemon.socket)
    try:
        keys, _ = a.publish(tokens)
        monkeypatch.setattr(orbitkv, "MAX_QUERY_BLOCKS", 3)
        assert a.exists(keys) == 3
        assert a.exists(keys[3:], prefix=keys[:3]) == 0, "the prefix alone fills the limit"
        monkeypatch.undo()
        assert a.exists(keys) == 4
        assert a.backend.counters()["queries"] == 2, "no Query past the limit was sent"
    finally:
        a.close()


def test_pages_not_stored_are_not_found(daemon: Daemon, model_dir: Path) -> None:
    r = Rank(model_dir, "prober", daemon.socket)
    keys = r.keys([t + 1 for t in TOKENS])
    assert r.exists(keys) == 0
    done, _ = r.get(keys)
    assert done == [False] * 4
    r.close()


@pytest.fixture(scope="module")
def stored(daemon: Daemon, model_dir: Path) -> list[str]:
    r = Rank(model_dir, "base", daemon.socket)
    keys, _ = r.publish(TOKENS, b"base")
    same = Rank(model_dir, "same", daemon.socket)
    assert same.exists(keys) == 4
    same.close()
    r.close()
    return keys


def zero(model: Path, socket: str, keys: list[str], name: str, **kw: object) -> None:
    r = Rank(model, name, socket, **kw)  # type: ignore[arg-type]
    try:
        assert r.exists(keys) == 0, f"{name}: another computation's records"
    finally:
        r.close()


def test_another_dtype(daemon: Daemon, model_dir: Path, stored: list[str]) -> None:
    zero(model_dir, daemon.socket, stored, "fp16", dtype="float16")


def test_another_page_size(daemon: Daemon, model_dir: Path, stored: list[str]) -> None:
    """A page size of 32 hashes other pages: the first 32 tokens' key is looked up."""
    r = Rank(model_dir, "page32", daemon.socket, page=32)
    try:
        assert r.exists(r.keys(TOKENS)) == 0
        # The same hashes under another page size: still nothing.
        assert r.exists(stored[:2]) == 0
    finally:
        r.close()


def test_one_byte_of_the_model_config(
    daemon: Daemon, model_dir: Path, stored: list[str], tmp_path: Path
) -> None:
    other = tmp_path / "model"
    shutil.copytree(model_dir, other)
    config = json.loads((other / "config.json").read_text())
    config["rms_norm_eps"] = config.get("rms_norm_eps", 1e-6) * 2
    (other / "config.json").write_text(json.dumps(config))
    zero(other, daemon.socket, stored, "edited")


def test_another_scope(
    daemon: Daemon, model_dir: Path, stored: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ORBITKV_CACHE_SCOPE", "tenant-b")
    zero(model_dir, daemon.socket, stored, "scoped")


def test_another_model_override(daemon: Daemon, model_dir: Path, stored: list[str]) -> None:
    zero(
        model_dir,
        daemon.socket,
        stored,
        "overridden",
        args={"json_model_override_args": json.dumps({"rope_theta": 5e5})},
    )
