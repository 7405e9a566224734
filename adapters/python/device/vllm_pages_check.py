"""The vLLM connector's page memory on a GPU, without vLLM (the GPU machine has PyTorch only).

KV caches are allocated by torch in vLLM's shape: one allocation for every layer, each layer a
view of `[block, page]` (layer-outermost `LBNHC` and block-outermost `BLNHC`). The connector's
`orbitkv.vllm.pages.page_memory` registers them with a real `orbitkv serve` (built with the
`cuda` feature) as a device pool, by the allocation's IPC handle. Then, for each placement:
publish after the step's CUDA event, load back into other blocks of another instance and compare
on the device, a stale generation refused, and the time of Publish and Load against torch's own
copy of the same bytes between the device and pinned memory (printed, not gated).

    python adapters/python/device/vllm_pages_check.py [--host] [--orbitkv BIN]

`--host` runs the same checks over host memory inside a pool the package mapped (registered in
place), so the script itself is tested where there is no GPU. Every check prints `PASS` or
`FAIL name: why`; the last line is `N passed, M failed`. Exit 0 when all passed, 1 when one
failed, 2 when there is no CUDA device (or no torch) to check."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

# A 2 MiB page: 32 layers of 16 tokens, 8 KV heads of 128 (bfloat16), K and V.
LAYERS, TOKENS, HEADS, HEAD = 32, 16, 8, 128
BLOCKS = 160
# Blocks published, and the first block the consumer loads them into.
PUBLISHED, LOADED_AT = 128, 16


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
    binary = args.orbitkv or os.environ.get("ORBITKV_BIN") or shutil.which("orbitkv")
    if binary is None:
        print("FAIL setup: no orbitkv binary (--orbitkv, ORBITKV_BIN or PATH)")
        return 1
    with tempfile.TemporaryDirectory() as root, serve(binary, Path(root)) as socket:
        results = [run(name, check) for name, check in checks(socket, args.host)]
    failed = results.count(False)
    print(f"{len(results) - failed} passed, {failed} failed")
    return 1 if failed else 0


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--host", action="store_true", help="host memory instead of a GPU")
    p.add_argument("--orbitkv", help="the orbitkv binary (default: ORBITKV_BIN, then PATH)")
    return p.parse_args()


def run(name: str, check: Callable[[], str | None]) -> bool:
    try:
        note = check()
    except Exception as e:  # every failure is reported, and the next check runs
        print(f"FAIL {name}: {type(e).__name__}: {e}", flush=True)
        return False
    print(f"PASS {name}" + (f" ({note})" if note else ""), flush=True)
    return True


class serve:
    """`orbitkv serve` in `root`, stopped on exit."""

    def __init__(self, binary: str, root: Path) -> None:
        self.socket = str(root / "orbitkv.sock")
        self.log = root / "serve.log"
        cmd = [binary, "serve", "--data-dir", str(root / "data"), "--socket", self.socket]
        cmd += ["--metrics", "127.0.0.1:0", "--dram-bytes", "2GiB", "--ssd-bytes", "2GiB"]
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


def checks(socket: str, host: bool) -> list[tuple[str, Callable[[], str | None]]]:
    out: list[tuple[str, Callable[[], str | None]]] = []
    for seed, placement in enumerate(("LBNHC", "BLNHC")):
        trial = Trial(socket, placement, host, seed)
        out += [
            (f"{placement}: registered as {trial.kind}", trial.register),
            (f"{placement}: published after the step's event", trial.publish),
            (f"{placement}: loaded back byte-exact", trial.load),
            (f"{placement}: a stale generation refused", trial.stale),
        ]
    return out


class Trial:
    """A producer and a consumer instance of one model, KV in one placement."""

    def __init__(self, socket: str, placement: str, host: bool, seed: int) -> None:
        from engine import Engine

        self.socket, self.placement, self.host, self.seed = socket, placement, host, seed
        self.kind = "in place" if host else "device"
        self.producer, self.consumer = (
            Engine(
                f"gpu-{role}-{placement}",
                no_scheduler=True,
                layers=LAYERS,
                kv_heads=HEADS,
                head_size=HEAD,
                block_tokens=TOKENS,
            )
            for role in ("producer", "consumer")
        )
        self.hashes: list[bytes] = []

    def _kv(self) -> tuple[object, list[object]]:
        """vLLM's allocation: one buffer, a `[block, page]` view per layer."""
        import orbitkv
        import torch

        lb = self.producer.layer_bytes()
        size = LAYERS * BLOCKS * lb
        if self.host:
            pages = orbitkv.mapped.allocate(BLOCKS, LAYERS * lb).pages
            raw = torch.frombuffer(pages, dtype=torch.uint8)[:size]
        else:
            raw = torch.zeros(size, dtype=torch.uint8, device="cuda")
        if self.placement == "LBNHC":
            layers = list(raw.view(LAYERS, BLOCKS, lb).unbind(0))
        else:
            grid = raw.view(BLOCKS, LAYERS, lb)
            layers = [grid[:, i] for i in range(LAYERS)]
        return raw, layers

    def register(self) -> str | None:
        from orbitkv.vllm.pages import page_memory

        lb = self.producer.layer_bytes()
        self.memories = []
        self.sealed = []
        for engine in (self.producer, self.consumer):
            raw, layers = self._kv()
            memory = page_memory({0: layers}, lb, BLOCKS)  # type: ignore[dict-item]
            if memory.kind != self.kind:
                raise AssertionError(f"registered as {memory.kind}")
            _, sealed = engine.seal(self.socket)
            memory.register(engine.worker_conn(0), sealed[0].token)
            self.memories.append((raw, memory))
            self.sealed.append(sealed[0])
        return None

    def publish(self) -> str:
        import orbitkv
        import torch
        from engine import payload, tokens
        from orbitkv.vllm.pages import POOL, page_run

        raw, memory = self.memories[0]
        lb, bt = self.producer.layer_bytes(), TOKENS
        self.hashes = orbitkv.vllm_block_hashes(tokens(self.seed, PUBLISHED * bt), bt)
        pages = []
        for i, h in enumerate(self.hashes):
            data = torch.frombuffer(bytearray(payload(h, 0, 0, LAYERS * lb)), dtype=torch.uint8)
            for layer, part in zip(memory.layers, data.view(LAYERS, lb), strict=True):
                page_run(layer, i).copy_(part, non_blocking=True)
            generation = memory.states.reuse(i)
            parent = self.hashes[i - 1] if i else b""
            pages.append((0, 0, h, parent, i * bt, (i + 1) * bt, POOL, i, generation))
        fence = memory.fence()
        if fence is not None:
            fence.synchronize()
        s = self.sealed[0]
        conn = self.producer.worker_conn(0)
        t0 = time.perf_counter()
        request = conn.submit_publish(s.token, s.epoch, pages)
        copied = conn.wait(request)
        took = time.perf_counter() - t0
        assert isinstance(copied, orbitkv.Pages) and copied.all_ok, copied
        durable = conn.wait(request)
        assert isinstance(durable, orbitkv.Pages) and durable.all_ok, durable
        baseline = copy_time(raw, to_device=False)
        return f"{rate(raw, took)}; torch's copy {rate(raw, baseline)}: {baseline / took:.2f}x"

    def load(self) -> str:
        import orbitkv
        import torch
        from orbitkv.vllm.pages import POOL, page_run

        raw, memory = self.memories[1]
        s = self.sealed[1]
        conn = self.consumer.worker_conn(0)
        end = PUBLISHED * TOKENS
        leased = conn.acquire(s.token, s.epoch, 0, end, [(0, self.hashes)])
        assert isinstance(leased, orbitkv.Leased) and leased.proof.boundary == end, leased
        self.lease = leased.lease
        pages = []
        for load in leased.proof.loads:
            for i in load.blocks:
                block = LOADED_AT + i
                pages.append((i, 0, 0, POOL, block, memory.states.reuse(block), 0, LAYERS))
        t0 = time.perf_counter()
        statuses = conn.load(s.token, s.epoch, self.lease, pages)
        took = time.perf_counter() - t0
        assert statuses == ["ok"] * len(pages), statuses
        src = self.memories[0][1]
        for i in range(PUBLISHED):
            for a, b in zip(src.layers, memory.layers, strict=True):
                if not torch.equal(page_run(a, i), page_run(b, LOADED_AT + i)):
                    raise AssertionError(f"block {i}: other bytes")
        baseline = copy_time(raw, to_device=True)
        return f"{rate(raw, took)}; torch's copy {rate(raw, baseline)}: {baseline / took:.2f}x"

    def stale(self) -> str | None:
        from orbitkv.vllm.pages import POOL

        _, memory = self.memories[1]
        s = self.sealed[1]
        generation = memory.states.generation(LOADED_AT)
        memory.states.reuse(LOADED_AT)
        page = (0, 0, 0, POOL, LOADED_AT, generation, 0, LAYERS)
        statuses = self.consumer.worker_conn(0).load(s.token, s.epoch, self.lease, [page])
        assert statuses == ["stale_generation"], statuses
        self.consumer.conns[0].release(s.token, self.lease)
        self.producer.close()
        self.consumer.close()
        return None


def copy_time(raw: object, to_device: bool) -> float:
    """Seconds torch takes to copy `raw`'s published bytes between it and pinned memory (a
    host copy when `raw` is host memory)."""
    import torch

    assert isinstance(raw, torch.Tensor)
    n = PUBLISHED * raw.numel() // BLOCKS
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


def rate(raw: object, seconds: float) -> str:
    import torch

    assert isinstance(raw, torch.Tensor)
    n = PUBLISHED * raw.numel() // BLOCKS
    return f"{n / seconds / 1e9:.2f} GB/s"


if __name__ == "__main__":
    sys.exit(main())
