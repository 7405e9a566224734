"""A small engine written against the package, as an adapter would be: its ranks register,
its workers keep host pools, publish pages and load what a query proves. Its pages hold bytes
derived from each block's hash, so a load is checked byte for byte."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Literal

import orbitkv

ELEM = 2  # bytes per element (bfloat16)


@dataclass(frozen=True)
class Group:
    """One cache group: its id, what it holds, its recovery rule and its layers."""

    id: int
    component: str = "dense_kv"
    rule: str = "prefix"
    param: int = 0


@dataclass
class Engine:
    """An instance of the model computation `model`: `workers` ranks splitting the KV heads."""

    name: str
    workers: int = 1
    model: str = "py/dense-2l"
    layers: int = 2
    kv_heads: int = 2
    head_size: int = 16
    block_tokens: int = 4
    groups: tuple[Group, ...] = (Group(0),)
    # "page": each page's bytes together; "layer": layer-outermost with K and V apart (vLLM).
    placement: str = "page"
    aliased: bool = False
    # One record for every rank (MLA's latent rows): published under the replicated rank.
    replicated: bool = False
    attention_backend: str = "flash_attn"
    no_scheduler: bool = False
    seal_timeout_ms: int = 10_000
    conns: list[orbitkv.Connection] = field(default_factory=list)

    @property
    def identity(self) -> bytes:
        return hashlib.sha256(self.model.encode()).digest()

    def layer_bytes(self) -> int:
        return 2 * self.block_tokens * self.kv_heads * self.head_size * ELEM

    def page_bytes(self) -> int:
        """Bytes of one page of one group, per rank."""
        return self.layer_bytes() * self.layers

    def format(self, rank: int) -> orbitkv.StateFormat:
        bt, h, d = self.block_tokens, self.kv_heads, self.head_size
        return orbitkv.StateFormat(
            dtype="bfloat16",
            kv_quant="bfloat16",
            block_tokens=bt,
            layers=self.layers,
            layout=[
                ("layer", self.layers, self.layer_bytes()),
                ("kv_split", 2, bt * h * d * ELEM),
                ("token", bt, h * d * ELEM),
                ("kv_head", h, d * ELEM),
                ("head_dim", d, ELEM),
            ],
            kv_heads=h,
            head_size_k=d,
            head_size_v=d,
            engine="vllm",
            release="0.33.0",
            attention_backend=self.attention_backend,
            rank="replicated" if self.replicated else rank,
            tensor=self.workers,
        )

    def layout(self) -> orbitkv.StorageLayout:
        groups = [
            orbitkv.CacheGroup(
                id=g.id,
                component=g.component,
                block_tokens=self.block_tokens,
                page_bytes=self.page_bytes(),
                formats=[self.format(r) for r in range(1 if self.replicated else self.workers)],
            )
            for g in self.groups
        ]
        return orbitkv.StorageLayout(groups, tensor=self.workers)

    def spec(
        self, pool: int, pages: int, groups: tuple[Group, ...] | None = None
    ) -> orbitkv.PoolSpec:
        """A pool of `pages` pages holding `groups` (all by default), placed as `placement` says."""
        groups = self.groups if groups is None else groups
        size, lb = self.page_bytes(), self.layer_bytes()
        page = size if self.aliased else size * len(groups)
        geometry = []
        for i, g in enumerate(groups):
            start = 0 if self.aliased else i * size
            if self.placement == "page":
                geometry.append(
                    orbitkv.GroupGeometry.packed(
                        group=g.id,
                        layers=self.layers,
                        offset=start,
                        layer_stride=lb,
                        layer_bytes=lb,
                        page_bytes=page,
                    )
                )
            else:
                # Layer-outermost: each layer's K of every page, then each layer's V.
                run = lb // 2
                base = pages * start
                geometry.append(
                    orbitkv.GroupGeometry(
                        group=g.id,
                        layers=self.layers,
                        offset=base,
                        page_stride=run,
                        layer_stride=pages * lb,
                        layer_bytes=lb,
                        parts=2,
                        part_stride=pages * run,
                    )
                )
        return orbitkv.PoolSpec(
            pool=pool, page_bytes=page, pages=pages, groups=geometry, aliased=self.aliased
        )

    def submit_register(
        self, conn: orbitkv.Connection, role: Literal["scheduler", "worker"], rank: int
    ) -> int:
        formats = [self.format(rank).encode() for _ in self.groups] if role == "worker" else []
        return conn.submit_register(
            instance=self.name,
            role=role,
            rank=rank,
            workers=self.workers,
            identity=self.identity,
            layout=self.layout().encode(),
            domain="vllm/sha256_cbor",
            rules=[(g.id, g.rule, g.param) for g in self.groups],
            formats=formats,
            model=self.model,
            seal_timeout_ms=self.seal_timeout_ms,
            no_scheduler=self.no_scheduler,
        )

    def seal(self, socket: str) -> tuple[orbitkv.Sealed | None, list[orbitkv.Sealed]]:
        """Registers every rank, each on its own connection: (scheduler, workers) sealed."""
        sched_conn = None if self.no_scheduler else orbitkv.Connection(socket)
        worker_conns = [orbitkv.Connection(socket) for _ in range(self.workers)]
        ids = [self.submit_register(c, "worker", r) for r, c in enumerate(worker_conns)]
        sched = None
        if sched_conn is not None:
            sched = sched_conn.await_seal(self.submit_register(sched_conn, "scheduler", 0))
            self.conns.append(sched_conn)
        workers = [c.await_seal(i) for c, i in zip(worker_conns, ids, strict=True)]
        self.conns.extend(worker_conns)
        return sched, workers

    def worker_conn(self, rank: int) -> orbitkv.Connection:
        return self.conns[rank if self.no_scheduler else rank + 1]

    def close(self) -> None:
        for c in self.conns:
            c.close()


def tokens(seed: int, n: int) -> list[int]:
    """`n` token ids of request `seed`."""
    return [(seed * 7919 + i * 31) % 50_000 for i in range(n)]


def payload(block_hash: bytes, group: int, rank: int, size: int) -> bytes:
    """The bytes a page of this block, group and rank holds."""
    return hashlib.shake_256(block_hash + bytes([group, rank])).digest(size)
