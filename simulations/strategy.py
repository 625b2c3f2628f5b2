"""Named strategies: each is a choice of real policies, by name, plus a few knobs.

A strategy maps to `p2p.swarm.SwarmConfig` fields (which chunk picker and
peer chooser, whether peers are used at all), the name of a handout policy
in `tracker.handout.HANDOUT_POLICIES`, and whether the node is given the
recorded hot-block order (`PrefetchGiven`). A sweep over strategies is a loop
over these names; no policy logic lives here.

- `origin_only`: today's baseline. Every node pulls every chunk from the
  origin, in order; no tracker, no peers.
- `random_peers`: BitTorrent-like. Uniform handout, any holder, random chunk
  order. It keeps the swarm core's origin-fetcher rule, so that the
  comparison with `rack_aware` isolates peer and chunk selection.
- `rack_aware`: Bootseer without hot-block prefetch. Rack-aware handout and
  peer choice, rarest first; a node is ready when it holds every chunk.
- `rack_aware_prefetch`: Bootseer. As `rack_aware`, and contents that have a
  hot set get it as the prefetch order; a node is ready when it holds the hot
  set of such contents (the container starts, the rest streams behind it).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from p2p.swarm import SwarmConfig


@dataclass(frozen=True, slots=True)
class Strategy:
    name: str
    swarm: SwarmConfig
    handout: str  # a name in tracker.handout.HANDOUT_POLICIES
    prefetch: bool  # give the hot-block order and start once it is held
    uses_tracker: bool = True
    notes: str = field(default="", compare=False)


STRATEGIES: dict[str, Strategy] = {
    "origin_only": Strategy(
        "origin_only", SwarmConfig(use_peers=False, chunk_picker="in_order"), "random",
        prefetch=False, uses_tracker=False, notes="every node pulls everything from the origin"),
    "random_peers": Strategy(
        "random_peers",
        SwarmConfig(chunk_picker="random", peer_chooser="random"), "random",
        prefetch=False, notes="uniform handout, random peer, random chunk order"),
    "rack_aware": Strategy(
        "rack_aware", SwarmConfig(chunk_picker="rarest_first", peer_chooser="rack_aware"),
        "rack_aware", prefetch=False, notes="Bootseer policies, full content before start"),
    "rack_aware_prefetch": Strategy(
        "rack_aware_prefetch",
        SwarmConfig(chunk_picker="rarest_first", peer_chooser="rack_aware"),
        "rack_aware", prefetch=True, notes="Bootseer policies, hot set first, start on it"),
}


def get_strategy(name: str, swarm_overrides: dict[str, Any] | None = None) -> Strategy:
    """The strategy `name`, with scenario overrides of SwarmConfig fields applied.

    Overrides never change what makes the strategy itself (`use_peers`,
    `chunk_picker`, `peer_chooser`).
    """
    try:
        strategy = STRATEGIES[name]
    except KeyError:
        raise ValueError(f"unknown strategy {name!r}; choose from {sorted(STRATEGIES)}") from None
    if not swarm_overrides:
        return strategy
    fixed = {"use_peers", "chunk_picker", "peer_chooser"}
    kept = {k: v for k, v in swarm_overrides.items() if k not in fixed}
    return replace(strategy, swarm=replace(strategy.swarm, **kept))
