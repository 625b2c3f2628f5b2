"""Where a simulation's time goes: cProfile of one run, grouped by owner.

    python benchmarks/sim_profile.py [SCENARIO] [--nodes N] [--strategy NAME] [--top 25]

Runs the scenario under cProfile and prints the functions with the most
own time, then the share of own time by owner: the swarm core (p2p/), the
tracker core (tracker/), the simulator (simulations/) and the rest (heapq,
numpy, dataclass constructors). cProfile inflates the cost of small Python
calls, so the shares lean towards code that makes many of them (the cores);
a sampling profiler (py-spy record -f raw) gives truer absolute shares.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time
from collections import Counter

from simulations.scenario import load, override
from simulations.simulation import Simulation

OWNERS = (("p2p/", "swarm core (p2p)"), ("tracker/", "tracker core"),
          ("simulations/", "simulator"))


def owner(filename: str) -> str:
    for marker, name in OWNERS:
        if f"/{marker}" in filename:
            return name
    return "other (stdlib, numpy, builtins)"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("scenario", nargs="?", default="scale")
    p.add_argument("--nodes", type=int, default=1000)
    p.add_argument("--strategy", default=None)
    p.add_argument("--top", type=int, default=25)
    args = p.parse_args()
    sim = Simulation(override(load(args.scenario), nodes=args.nodes, strategy=args.strategy))
    profile = cProfile.Profile()
    started = time.perf_counter()
    profile.enable()
    stop = sim.run()
    profile.disable()
    print(f"{args.scenario} at {args.nodes} nodes: {stop}, "
          f"{time.perf_counter() - started:.1f} s under the profiler, "
          f"{sim.events_delivered:,} swarm calls, {sim.loop.events:,} loop callbacks")
    stats = pstats.Stats(profile)
    stats.sort_stats("tottime").print_stats(args.top)
    shares: Counter[str] = Counter()
    raw = stats.stats  # type: ignore[attr-defined]
    for (filename, _, _), (_, _, own, _, _) in raw.items():
        shares[owner(filename)] += own
    total = sum(shares.values())
    for name, own in shares.most_common():
        print(f"{100 * own / total:5.1f}%  {own:7.2f} s  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
