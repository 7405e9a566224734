"""The vLLM connector's page memory on a GPU, without vLLM (the GPU machine has PyTorch only).

KV caches are allocated by torch in the shapes vLLM's planner gives (`vllm_shapes.json`, made by
the engine test `test_device_shapes.py`): a dense model with layers outermost and with blocks
outermost, a hybrid one (full attention beside sliding windows, the groups aliasing one
allocation) and an MLA one under tensor parallelism (one copy for both ranks). The connector's
`orbitkv.vllm.pages.page_memory` registers them with a real `orbitkv serve` (built with the
`cuda` feature) as a device pool, by the allocation's IPC handle. For each shape: publish after
the step's CUDA event; then another process, with tensors of its own, loads what the daemon
proves and compares it on the device, and a stale generation is refused; the time of Publish
and Load is printed beside torch's own copy of the same bytes between the device and pinned
memory (`cuMemcpyAsync`), not gated.

    python adapters/python/device/vllm_pages_check.py [--host] [--orbitkv BIN]

`--host` runs the same checks over host memory inside a pool the package mapped (registered in
place), so the script itself is tested where there is no GPU. Every check prints `PASS` or
`FAIL name: why`; the last line is `N passed, M failed`. Exit 0 when all passed, 1 when one
failed, 2 when there is no CUDA device (or no torch) to check."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

# Blocks each group publishes from the start of a request (at most; the groups share the
# blocks), and where the consumer loads them.
PUBLISHED, LOADED_AT = 64, 16
# The warm-up request's seed is this plus the side's: apart from every side's own.
WARM_UP_SEED = 1000
# How long the consumer's process may take.
CONSUMER_WAIT = 30.0


def main() -> int:
    args = parse()
    try:
        import torch
    except ImportError:
        print("no torch here: nothing to check")
        return 2
    if not args.host and not torch.cuda.is_available():
        print("no CUDA device: nothing to check (--host checks host memory)")
        return 2
    if args.consume is not None:
        return consume(args)
    binary = args.orbitkv or os.environ.get("ORBITKV_BIN") or shutil.which("orbitkv")
    if binary is None:
        print("FAIL setup: no orbitkv binary (--orbitkv, ORBITKV_BIN or PATH)")
        return 1
    with (
        tempfile.TemporaryDirectory() as root,
        serve(binary, Path(root), args.dram_bytes) as socket,
    ):
        results = []
        for seed, shape in enumerate(shapes()):
            trial = Trial(Side(shape, socket, args.host, seed, "producer"))
            results += [run(name, check) for name, check in trial.checks()]
            results += trial.consumer()
    failed = results.count(False)
    print(f"{len(results) - failed} passed, {failed} failed")
    return 1 if failed else 0


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--host", action="store_true", help="host memory instead of a GPU")
    p.add_argument("--orbitkv", help="the orbitkv binary (default: ORBITKV_BIN, then PATH)")
    p.add_argument(
        "--dram-bytes",
        default="2GiB",
        help="the daemon's DRAM tier; one smaller than a Publish (64MiB) reuses evicted copies' "
        "memory, as a full tier does (default: 2GiB)",
    )
    p.add_argument("--consume", help=argparse.SUPPRESS)  # the consumer's process: shape name
    p.add_argument("--socket", help=argparse.SUPPRESS)
    p.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    return p.parse_args()


def run(name: str, check: Callable[[], str | None]) -> bool:
    try:
        note = check()
    except Exception as e:  # every failure is reported, and the next check runs
        print(f"FAIL {name}: {type(e).__name__}: {e}", flush=True)
        return False
    print(f"PASS {name}" + (f" ({note})" if note else ""), flush=True)
    return True


def shapes() -> list[dict[str, Any]]:
    """vLLM's plans, as the engine test wrote them."""
    return list(json.loads((HERE / "vllm_shapes.json").read_text()))


class serve:
    """`orbitkv serve` in `root`, stopped on exit."""

    def __init__(self, binary: str, root: Path, dram_bytes: str) -> None:
        self.socket = str(root / "orbitkv.sock")
        self.log = root / "serve.log"
        cmd = [binary, "serve", "--data-dir", str(root / "data"), "--socket", self.socket]
        cmd += ["--metrics", "127.0.0.1:0", "--dram-bytes", dram_bytes, "--ssd-bytes", "2GiB"]
        self.proc = subprocess.Popen(cmd, stdout=self.log.open("w"), stderr=subprocess.STDOUT)

    def __enter__(self) -> str:
        deadline = time.monotonic() + 60
        while "listening on" not in self.log.read_text():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.__exit__()
                raise SystemExit(
                    f"FAIL setup: orbitkv serve did not start:\n{self.log.read_text()}"
                )
            time.sleep(0.05)
        print(self.log.read_text().strip(), flush=True)
        return self.socket

    def __exit__(self, *_: object) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


@dataclass
class Side:
    """One instance of a shape: its ranks' KV memory, registered with the daemon."""

    shape: dict[str, Any]
    socket: str
    host: bool
    seed: int
    role: str

    def __post_init__(self) -> None:
        from engine import Engine, Group

        groups = self.shape["groups"]
        self.layer_bytes = int(groups[0]["layer_bytes"])
        self.block_tokens = int(groups[0]["block_tokens"])
        self.layers = len(groups[0]["layers"])
        self.mla = groups[0]["kind"] == "mla"
        component = {
            "full": "dense_kv",
            "window": "sliding_window_kv",
            "mla": "mla",
            "mamba": "ssm_state",
        }
        rule = {"window": "window", "mamba": "checkpoint"}
        self.engine = Engine(
            f"gpu-{self.role}-{self.shape['name']}",
            workers=int(self.shape["tensor"]),
            model=f"gpu/{self.shape['name']}",
            layers=self.layers,
            # One head whose K and V halves make a layer's page: the bytes are what count.
            kv_heads=1,
            head_size=self.layer_bytes // (4 * self.block_tokens),
            block_tokens=self.block_tokens,
            groups=tuple(
                Group(
                    g["id"],
                    component[g["kind"]],
                    rule.get(g["kind"], "prefix"),
                    int(g["window"]) if g["kind"] == "window" else self.block_tokens,
                )
                for g in groups
            ),
            aliased=len(groups) > 1,
            replicated=self.mla,
            no_scheduler=True,
        )
        assert self.engine.layer_bytes() == self.layer_bytes, "a layer's page in whole heads"
        self.hashes: list[bytes] = []
        self.raw: list[torch.Tensor] = []
        self.memories: list[Any] = []
        self.sealed: list[Any] = []

    @property
    def kind(self) -> str:
        return "in place" if self.host else "device"

    def kv(self) -> tuple[torch.Tensor, dict[int, list[torch.Tensor]]]:
        """vLLM's allocation: one buffer, a `[block, page]` view per layer, by group."""
        import orbitkv
        import torch

        blocks = int(self.shape["blocks"])
        size = int(self.shape["tensors"][0]["size"])
        if self.host:
            pages = orbitkv.mapped.allocate(blocks, size // blocks).pages
            raw = torch.frombuffer(pages, dtype=torch.uint8)[:size]
        else:
            raw = torch.zeros(size, dtype=torch.uint8, device="cuda")
        # A layer's page is its state's bytes: a Mamba layer's fill its page in part.
        width = {n: int(g["state_bytes"]) for g in self.shape["groups"] for n in g["layers"]}
        views = {}
        for t in self.shape["tensors"]:
            for i, name in enumerate(t["layers"]):
                views[name] = raw.as_strided(
                    (blocks, width[name]),
                    (int(t["block_stride"]), 1),
                    int(t["offset"]) + i * int(t["layer_stride"]),
                )
        return raw, {g["id"]: [views[n] for n in g["layers"]] for g in self.shape["groups"]}

    def register(self) -> str:
        """Every rank's memory, registered as the worker connector registers it."""
        from orbitkv.vllm.pages import page_memory

        _, self.sealed = self.engine.seal(self.socket)
        for rank in range(self.engine.workers):
            raw, groups = self.kv()
            memory = page_memory(groups, self.layer_bytes, int(self.shape["blocks"]))
            if memory.kind != self.kind:
                raise AssertionError(f"registered as {memory.kind}")
            memory.register(self.engine.worker_conn(rank), self.sealed[rank].token)
            self.raw.append(raw)
            self.memories.append(memory)
        return f"{self.engine.workers} rank(s), {len(self.shape['groups'])} group(s)"

    def request(self, seed: int | None = None) -> list[bytes]:
        """The block hashes of the request of `seed` (the side's own by default)."""
        import orbitkv
        from engine import tokens

        bt = self.block_tokens
        seed = self.seed if seed is None else seed
        return list(orbitkv.vllm_block_hashes(tokens(seed, self.published * bt), bt))

    @property
    def published(self) -> int:
        """Blocks each group publishes: the groups' blocks apart, and room to load them."""
        return min(PUBLISHED, (int(self.shape["blocks"]) - LOADED_AT) // len(self.shape["groups"]))

    def block(self, group: int, index: int, at: int = 0) -> int:
        """The vLLM block of page `index` of `group` (each group its own blocks: they alias)."""
        ids = [int(g["id"]) for g in self.shape["groups"]]
        return at + ids.index(group) * self.published + index

    def expected(self, h: bytes, group: int) -> torch.Tensor:
        """What a page of `group` holds for block hash `h`, a row per layer."""
        import torch
        from engine import payload

        (width,) = [int(g["state_bytes"]) for g in self.shape["groups"] if g["id"] == group]
        data = payload(h, group, 0, self.layers * width)
        out = torch.frombuffer(bytearray(data), dtype=torch.uint8).view(self.layers, -1)
        return out if self.host else out.cuda()


class Trial:
    """The producer's side of a shape: registered, its pages published; then the consumer's
    process."""

    def __init__(self, side: Side) -> None:
        self.side = side
        self.name = side.shape["name"]

    def checks(self) -> list[tuple[str, Callable[[], str | None]]]:
        return [
            (f"{self.name}: registered as {self.side.kind}", self.side.register),
            (f"{self.name}: published after the step's event", self.publish),
        ]

    def publish(self) -> str:
        """Two Publishes of the same pages, each timed until PublishCopied: one of a warm-up
        request on the fresh daemon (its buffers first touched), then the side's own."""
        side = self.side
        cold, n = self.publish_once(side.request(WARM_UP_SEED + side.seed))
        warm, _ = self.publish_once(side.request())
        base = copy_time(side.raw[0], n, to_device=False)
        return (
            f"first {n / cold / 1e9:.2f} GB/s, second {n / warm / 1e9:.2f} GB/s; "
            f"torch's copy {n / base / 1e9:.2f} GB/s: {base / warm:.2f}x"
        )

    def publish_once(self, hashes: list[bytes]) -> tuple[float, int]:
        """Fills the pages with `hashes`' bytes and publishes them: the seconds until
        PublishCopied, and the bytes published."""
        import orbitkv
        from orbitkv.vllm.pages import POOL, page_run

        side = self.side
        memory = side.memories[0]
        bt = side.block_tokens
        pages = []
        for g in side.shape["groups"]:
            group = int(g["id"])
            for i, h in enumerate(hashes):
                block = side.block(group, i)
                for layer, part in zip(memory.groups[group], side.expected(h, group), strict=True):
                    page_run(layer, block).copy_(part.view(page_run(layer, block).shape))
                rank = orbitkv.RANK_REPLICATED if side.mla else 0
                parent = hashes[i - 1] if i else b""
                generation = memory.states.reuse(block)
                pages.append(
                    (group, rank, h, parent, i * bt, (i + 1) * bt, POOL, block, generation)
                )
        fence = memory.fence()
        if fence is not None:
            fence.synchronize()
        conn, s = side.engine.worker_conn(0), side.sealed[0]
        t0 = time.perf_counter()
        request = conn.submit_publish(s.token, s.epoch, pages)
        copied = conn.wait(request)
        took = time.perf_counter() - t0
        assert isinstance(copied, orbitkv.Pages) and copied.all_ok, copied
        durable = conn.wait(request)
        assert isinstance(durable, orbitkv.Pages) and durable.all_ok, durable
        return took, len(pages) * side.layers * side.layer_bytes

    def consumer(self) -> list[bool]:
        """The consumer's process: its lines relayed, each `PASS` or `FAIL` counted."""
        cmd = [sys.executable, __file__, "--consume", self.name, "--socket", self.side.socket]
        cmd += ["--seed", str(self.side.seed)] + (["--host"] if self.side.host else [])
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=CONSUMER_WAIT)
            out, rc = done.stdout + done.stderr, done.returncode
        except subprocess.TimeoutExpired as e:
            before = e.stdout.decode() if isinstance(e.stdout, bytes) else e.stdout or ""
            out, rc = f"{before}timed out after {CONSUMER_WAIT:.0f} s\n", -1
        results = []
        for line in out.splitlines():
            print(line, flush=True)
            if line.startswith(("PASS ", "FAIL ")):
                results.append(line.startswith("PASS "))
        if rc != 0 and all(results):
            print(f"FAIL {self.name}: the consumer's process exited {rc}", flush=True)
            results.append(False)
        return results


def consume(args: argparse.Namespace) -> int:
    """The consumer's process: registers tensors of its own, loads what the daemon proves, and
    checks them on the device; then a stale generation."""
    (shape,) = [s for s in shapes() if s["name"] == args.consume]
    side = Side(shape, args.socket, args.host, args.seed, "consumer")
    state: dict[str, Any] = {}
    checks = [
        (f"{side.shape['name']}: another process registered as {side.kind}", side.register),
        (f"{side.shape['name']}: loaded back byte-exact", lambda: load(side, state)),
        (f"{side.shape['name']}: a stale generation refused", lambda: stale(side, state)),
    ]
    results = [run(name, check) for name, check in checks]
    side.engine.close()
    return 0 if all(results) else 1


def load(side: Side, state: dict[str, Any]) -> str:
    import orbitkv
    import torch
    from orbitkv.vllm.pages import POOL, page_run

    hashes = side.request()
    end = len(hashes) * side.block_tokens
    groups = [(int(g["id"]), hashes) for g in side.shape["groups"]]
    loaded, took = 0, 0.0
    for rank in range(side.engine.workers):
        conn, s, memory = side.engine.worker_conn(rank), side.sealed[rank], side.memories[rank]
        leased = conn.acquire(s.token, s.epoch, 0, end, groups)
        assert isinstance(leased, orbitkv.Leased) and leased.proof.boundary == end, leased
        state.setdefault("leases", []).append(leased.lease)
        pages, placed = [], []
        for pl in leased.proof.loads:
            for i in pl.blocks:
                block = side.block(pl.group, i, LOADED_AT)
                generation = memory.states.reuse(block)
                pages.append((i, pl.group, pl.rank, POOL, block, generation, 0, side.layers))
                placed.append((pl.group, i, block))
        t0 = time.perf_counter()
        statuses = conn.load(s.token, s.epoch, leased.lease, pages)
        took += time.perf_counter() - t0
        # Rank 0's first page, loaded again below with the generation it had.
        state.setdefault("page", pages[0])
        assert statuses == ["ok"] * len(pages), statuses
        for group, i, block in placed:
            want = side.expected(hashes[i], group)
            for layer, part in zip(memory.groups[group], want, strict=True):
                if not torch.equal(page_run(layer, block).reshape(-1), part):
                    raise AssertionError(f"rank {rank}, group {group}, block {i}: other bytes")
        loaded += len(pages) * side.layers * side.layer_bytes
    base = copy_time(side.raw[0], loaded // side.engine.workers, to_device=True)
    per_rank = took / side.engine.workers
    rate_ = loaded / side.engine.workers / per_rank / 1e9
    return f"{rate_:.2f} GB/s; torch's copy {loaded / side.engine.workers / base / 1e9:.2f} GB/s"


def stale(side: Side, state: dict[str, Any]) -> None:
    memory, s = side.memories[0], side.sealed[0]
    page = state["page"]
    block = page[4]
    # The page's generation before a reuse: a copy still holding it is stale.
    memory.states.reuse(block)
    statuses = side.engine.worker_conn(0).load(s.token, s.epoch, state["leases"][0], [page])
    assert statuses == ["stale_generation"], statuses
    for rank, lease in enumerate(state["leases"]):
        side.engine.worker_conn(rank).release(side.sealed[rank].token, lease)


def copy_time(raw: torch.Tensor, n: int, to_device: bool) -> float:
    """Seconds torch takes to copy `n` bytes of `raw` between it and pinned memory (a host copy
    when `raw` is host memory): the best of three."""
    import torch

    src = raw[:n]
    host = torch.empty(n, dtype=torch.uint8, pin_memory=raw.is_cuda)
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        if to_device:
            src.copy_(host, non_blocking=True)
        else:
            host.copy_(src, non_blocking=True)
        if raw.is_cuda:
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    return best


if __name__ == "__main__":
    sys.exit(main())
