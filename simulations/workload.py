"""What every node must fetch, when it starts, and which nodes fail.

Theory of operation
-------------------
A workload is a list of content kinds. Each kind is one content that every
node needs (an image layer, a dependency snapshot), or, with `shards > 1`, a
family of contents of which node `i` needs shard `i % shards`: a checkpoint
whose shards differ per model-parallel rank and are shared by the
data-parallel replicas of that rank. The launch scenario is three kinds:
image, dependency snapshot, checkpoint.

A kind may have a hot set (`hot_fraction`): the chunks that startup really
touches, recorded on an earlier launch. Its order is drawn once per content
from the scenario seed; strategies with prefetch hand it to the swarm and
count the node ready when the hot set is held.

Nodes start at `uniform(0, start_jitter_s)`; `fail_fraction` of them (chosen
by the seed) fail at a uniform time in the churn window and never return.
Everything is drawn from the one rng passed in, in a fixed order.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from p2p.content import ContentId


@dataclass(frozen=True, slots=True)
class ContentKind:
    name: str
    size: int  # bytes (per shard)
    chunk_size: int  # bytes
    origins: tuple[str, ...]  # chunk c comes from origins[c % len(origins)]
    hot_fraction: float = 0.0
    shards: int = 1
    cpu_s: float = 0.0  # CPU-seconds per node once the bytes are there (`simulations.cpu`)
    cpu_origin_only_s: float | None = None  # the same for the origin_only baseline


@dataclass(frozen=True, slots=True)
class Workload:
    kinds: tuple[ContentKind, ...]
    start_jitter_s: float = 0.0
    fail_fraction: float = 0.0
    fail_window_s: tuple[float, float] = (0.0, 0.0)


@dataclass(frozen=True, slots=True)
class Content:
    """One content in the run: a kind, or one shard of it."""

    index: int
    id: ContentId
    size: int
    chunk_size: int
    chunks: int
    origins: tuple[int, ...]  # indices into the scenario's origins
    hot: tuple[int, ...]  # recorded hot-block order; empty if none
    cpu_s: float = 0.0
    cpu_origin_only_s: float = 0.0

    def cpu(self, strategy: str) -> float:
        """CPU-seconds a node spends on this content under `strategy` once it holds it."""
        return self.cpu_origin_only_s if strategy == "origin_only" else self.cpu_s

    def chunk_bytes(self, chunk: int) -> int:
        if chunk < self.chunks - 1:
            return self.chunk_size
        return self.size - self.chunk_size * (self.chunks - 1)


@dataclass(frozen=True, slots=True)
class Plan:
    contents: tuple[Content, ...]
    needs: tuple[tuple[int, ...], ...]  # node -> indices of the contents it needs
    start_s: tuple[float, ...]
    fail_s: tuple[float | None, ...]


def plan(workload: Workload, nodes: int, origin_index: dict[str, int],
         rng: random.Random) -> Plan:
    """Draw the run's contents, start times and failures from `rng`."""
    contents: list[Content] = []
    first_of_kind: list[int] = []
    for kind in workload.kinds:
        first_of_kind.append(len(contents))
        shards = min(kind.shards, nodes)
        for shard in range(shards):
            cid = ContentId(kind.name if kind.shards == 1 else f"{kind.name}.{shard}")
            chunks = max(1, -(-kind.size // kind.chunk_size))
            hot_count = round(chunks * kind.hot_fraction)
            hot = tuple(rng.sample(range(chunks), hot_count)) if hot_count else ()
            origins = tuple(origin_index[o] for o in kind.origins)
            baseline = kind.cpu_s if kind.cpu_origin_only_s is None else kind.cpu_origin_only_s
            contents.append(Content(len(contents), cid, kind.size, kind.chunk_size, chunks,
                                    origins, hot, kind.cpu_s, baseline))
    needs = tuple(
        tuple(first + (i % min(kind.shards, nodes))
              for first, kind in zip(first_of_kind, workload.kinds, strict=True))
        for i in range(nodes))
    start = tuple(rng.uniform(0.0, workload.start_jitter_s) if workload.start_jitter_s else 0.0
                  for _ in range(nodes))
    failing = set(rng.sample(range(nodes), round(nodes * workload.fail_fraction)))
    lo, hi = workload.fail_window_s
    fail = tuple(rng.uniform(lo, hi) if i in failing else None for i in range(nodes))
    return Plan(tuple(contents), needs, start, fail)
