"""The floor of a scenario: the fluid lower bound on when every node can be ready.

A run is judged against what its own network allows, not against another
run. Treating bytes as a fluid (no latency, no chunking, every link used to
the full from time zero, every node starting at once), no schedule can make
every node ready sooner than the largest of four times:

- `node_download`: the node that needs the most bytes, at its download rate
  (its NIC, or the agent's download cap if lower);
- `origin`: each origin sends each byte it is the source of at least once
  (chunk `c` of a content comes from `origins[c % len(origins)]`);
- `upload`: every byte every node receives is sent by an origin or by a node,
  so the total needed cannot arrive faster than the origins' egress plus all
  nodes' uploads (NIC, or the agent's upload cap);
- `rack_uplink`: each byte a rack needs enters it at least once, through its
  top-of-rack downlink (the rack's NICs / oversubscription; origins sit
  outside every rack).

"Ready" is the run's own rule: with a prefetch strategy a content with a hot
set counts its hot chunks only. Start jitter is left out (times are measured
from each node's own start), so with a long jitter the floor is a little
optimistic. Kraken's scenario is the plain case: 3 GB at 300 MB/s is 10 s.

No I/O; the caller passes the scenario's numbers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class NeededContent:
    """What being ready takes of one content: the bytes of each chunk that count."""

    chunk_bytes: tuple[int, ...]  # bytes of each chunk that readiness needs (0: not needed)
    origins: tuple[int, ...]  # chunk c from origins[c % len(origins)]

    @property
    def size(self) -> int:
        return sum(self.chunk_bytes)


@dataclass(frozen=True, slots=True)
class Floor:
    seconds: float
    by: str  # which bound is the floor
    bounds: dict[str, float]


def floor(contents: Sequence[NeededContent], needs: Sequence[Sequence[int]],
          rack_of: Sequence[int], down_Bps: float, up_Bps: float,
          origin_Bps: Sequence[float], oversubscription: float) -> Floor:
    """The floor of a run (see the module docstring). `needs[i]` lists the indices of the
    contents node `i` needs; `rack_of[i]` is its rack; rates in bytes per second."""
    per_node = [sum(contents[c].size for c in need) for need in needs]
    bounds = {"node_download": max(per_node, default=0) / down_Bps}
    served = [0] * len(origin_Bps)
    for c in sorted({c for need in needs for c in need}):
        content = contents[c]
        for chunk, nbytes in enumerate(content.chunk_bytes):
            served[content.origins[chunk % len(content.origins)]] += nbytes
    bounds["origin"] = max((b / r for b, r in zip(served, origin_Bps, strict=True)),
                           default=0.0)
    bounds["upload"] = sum(per_node) / (sum(origin_Bps) + len(needs) * up_Bps)
    racks: dict[int, set[int]] = {}
    size: dict[int, int] = {}
    for node, need in enumerate(needs):
        racks.setdefault(rack_of[node], set()).update(need)
        size[rack_of[node]] = size.get(rack_of[node], 0) + 1
    bounds["rack_uplink"] = max(
        (sum(contents[c].size for c in wanted) / (size[r] * down_Bps / oversubscription)
         for r, wanted in racks.items()), default=0.0)
    by = max(bounds, key=lambda k: bounds[k])
    return Floor(bounds[by], by, bounds)
