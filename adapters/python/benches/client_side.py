"""The Python side of the client benchmark (benches/benches/python_client.rs runs it, beside
the same operations through the Rust client, against one daemon): prints one JSON document.

Modes:
- ``query``: a one-worker instance publishes BLOCKS blocks, prints ``ready``, then for each
  line N read from standard input times N Queries of them one by one and prints their round
  trips (microseconds), so that the caller interleaves them finely with its own;
- ``gil``: a thread counting in a loop, timed alone and while another thread issues Queries
  back to back, in turn, four phases of each (the ratios of its rates, and the Queries
  answered);
- ``transfer``: prints ``ready``, then for each line R read from standard input publishes PAGES
  pages of PAGE_KIB KiB from a host pool as blocks of round R (until durable), acquires them and
  loads them into the pool, and prints the seconds of the Publish and of the Load.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import orbitkv
from engine import Engine, payload, tokens


class Instance:
    """A sealed one-worker instance with its pool registered."""

    def __init__(self, socket: str, name: str, engine: Engine, pages: int) -> None:
        self.engine = engine
        sched, sealed = engine.seal(socket)
        assert sched is not None
        self.sched: orbitkv.Sealed = sched
        self.worker = sealed[0]
        self.pool = orbitkv.HostPool(engine.spec(pool=1, pages=pages))
        engine.worker_conn(0).register_pool(self.worker.token, self.pool)
        self.pages = pages

    def fill(self) -> None:
        """Writes every page once (an engine's pages are written by its GPU)."""
        size = self.engine.page_bytes()
        for i in range(self.pages):
            self.pool.reuse(i)
            self.pool.write(i, 0, payload(i.to_bytes(4, "little"), 0, 0, size))

    def hashes(self, seed: int, blocks: int) -> list[bytes]:
        bt = self.engine.block_tokens
        return orbitkv.vllm_block_hashes(tokens(seed, blocks * bt), bt)

    def publish(self, hashes: list[bytes]) -> float:
        """Publishes `hashes` from pages 0.. until durable; returns the seconds it took."""
        bt = self.engine.block_tokens
        generations = [self.pool.reuse(i) for i in range(len(hashes))]
        pages = [
            (0, 0, h, hashes[i - 1] if i else b"", i * bt, (i + 1) * bt, 1, i, generations[i])
            for i, h in enumerate(hashes)
        ]
        start = time.perf_counter()
        copied, durable = self.engine.worker_conn(0).publish(
            self.worker.token, self.worker.epoch, pages
        )
        took = time.perf_counter() - start
        assert copied.all_ok and durable.all_ok, (copied, durable)
        return took

    def query(self, hashes: list[bytes]) -> orbitkv.Proof | orbitkv.Miss:
        end = len(hashes) * self.engine.block_tokens
        conn = self.engine.conns[0]
        return conn.query(self.sched.token, self.sched.epoch, 0, end, [(0, hashes)])

    def load(self, hashes: list[bytes]) -> float:
        """Acquires `hashes` and loads them into pages 0..; returns the Load's seconds."""
        end = len(hashes) * self.engine.block_tokens
        leased = self.engine.conns[0].acquire(
            self.sched.token, self.sched.epoch, 0, end, [(0, hashes)]
        )
        assert isinstance(leased, orbitkv.Leased) and leased.proof.boundary == end, leased
        layers = self.engine.layers
        pages = [(b, 0, 0, 1, b, self.pool.reuse(b), 0, layers) for b in range(len(hashes))]
        start = time.perf_counter()
        statuses = self.engine.worker_conn(0).load(
            self.worker.token, self.worker.epoch, leased.lease, pages
        )
        took = time.perf_counter() - start
        assert statuses == ["ok"] * len(pages), statuses
        self.engine.conns[0].release(self.sched.token, leased.lease)
        return took


def small(name: str) -> Engine:
    """Pages as the Rust side's `SimInstance::new(name, 1)`: 16 tokens, 2 layers, 1 head of 4."""
    return Engine(name, layers=2, kv_heads=1, head_size=4, block_tokens=16)


def query_mode(socket: str, name: str, blocks: int) -> None:
    inst = Instance(socket, name, small(name), blocks)
    inst.fill()
    hashes = inst.hashes(1, blocks)
    inst.publish(hashes)
    print("ready", flush=True)
    for line in sys.stdin:
        samples = []
        for _ in range(int(line)):
            start = time.perf_counter()
            proof = inst.query(hashes)
            samples.append((time.perf_counter() - start) * 1e6)
            assert isinstance(proof, orbitkv.Proof), proof
        print(json.dumps({"rtt_us": samples}), flush=True)
    inst.engine.close()


def gil_mode(socket: str, name: str, blocks: int, seconds: float) -> dict[str, object]:
    """Phases of `seconds` counting alone and counting beside the Query thread, in turn, four
    of each (so that a drift in the machine's speed reaches both alike)."""
    inst = Instance(socket, name, small(name), blocks)
    inst.fill()
    hashes = inst.hashes(2, blocks)
    inst.publish(hashes)

    def count(until: float) -> float:
        n = 0
        start = time.perf_counter()
        while time.perf_counter() < until:
            n += 1
        return n / (time.perf_counter() - start)

    asking = threading.Event()
    done = threading.Event()
    answered = 0

    def ask() -> None:
        nonlocal answered
        while not done.is_set():
            if not asking.wait(timeout=0.05):
                continue
            inst.query(hashes)
            answered += 1

    asker = threading.Thread(target=ask)
    asker.start()
    ratios = []
    for _ in range(4):
        solo = count(time.perf_counter() + seconds)
        asking.set()
        time.sleep(0.01)
        shared = count(time.perf_counter() + seconds)
        asking.clear()
        time.sleep(0.01)
        ratios.append(shared / solo)
    done.set()
    asker.join()
    inst.engine.close()
    return {"ratios": ratios, "queries": answered, "seconds": 4 * seconds}


def transfer_mode(socket: str, name: str, pages: int, page_kib: int) -> None:
    # Pages of `page_kib` KiB: 16 tokens x 8 heads x 128 x K,V x 2 B = 64 KiB a layer.
    engine = Engine(name, layers=page_kib // 64, kv_heads=8, head_size=128, block_tokens=16)
    inst = Instance(socket, name, engine, pages)
    inst.fill()
    print("ready", flush=True)
    for line in sys.stdin:
        hashes = inst.hashes(1000 + int(line), pages)
        publish = inst.publish(hashes)
        load = inst.load(hashes)
        doc = {"publish_s": publish, "load_s": load, "bytes": pages * engine.page_bytes()}
        print(json.dumps(doc), flush=True)
    engine.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("mode", choices=["query", "gil", "transfer"])
    p.add_argument("--socket", required=True)
    p.add_argument("--name", required=True)
    p.add_argument("--blocks", type=int, default=16)
    p.add_argument("--seconds", type=float, default=0.5)
    p.add_argument("--pages", type=int, default=64)
    p.add_argument("--page-kib", type=int, default=256)
    a = p.parse_args()
    if a.mode == "query":
        query_mode(a.socket, a.name, a.blocks)
    elif a.mode == "gil":
        print(json.dumps(gil_mode(a.socket, a.name, a.blocks, a.seconds)))
    else:
        transfer_mode(a.socket, a.name, a.pages, a.page_kib)


if __name__ == "__main__":
    main()
