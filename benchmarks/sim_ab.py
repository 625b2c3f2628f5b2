"""The simulator before and after, side by side: one scenario at two git revisions.

    python benchmarks/sim_ab.py --before REV [--after REV] [--rounds 2]
        [--scenario launch] [--nodes 1000] [--engine compiled|python]

Exports each revision's tree (`git archive`, as benchmarks/ab.py does) and runs
`bootseer sim SCENARIO --nodes N --json` from it, with PYTHONPATH pointing at
that tree. One uncounted warm-up run per side (it also builds that side's
compiled engine, once per source version); then rounds in ABBA order, so both
sides see the same machine load. It checks that both revisions computed the
same run (every summary figure but the cost), and prints one JSON line with
each side's CPU and wall seconds, their medians, and `speedup`: the median
CPU seconds before over after. CPU seconds move much less than wall time
when other work shares the machine; the load average is in the line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from ab import export  # benchmarks/ab.py: the same export of a revision's tree

# What may differ between two runs of one scenario: their cost.
COST = {"wall_seconds", "cpu_seconds", "peak_rss_mb", "engine", "events", "swarm_calls"}


def run(tree: Path, scenario: str, nodes: int, engine: str, out: Path) -> dict[str, Any]:
    exe = Path(sys.executable).parent / "bootseer"
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run([str(exe), "sim", scenario, "--nodes", str(nodes), "--json",
                           "--engine", engine, "--out", str(out)],
                          cwd=tree, env=env, capture_output=True, text=True, timeout=7200)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode != 0 or not lines:
        raise SystemExit(f"sim at {tree.name} failed ({done.returncode}):\n"
                         f"{done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", required=True, help="git revision measured as 'before'")
    parser.add_argument("--after", default="HEAD", help="git revision measured as 'after'")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--scenario", default="launch")
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--engine", choices=("compiled", "python"), default="compiled")
    args = parser.parse_args()
    runs: dict[str, list[dict[str, Any]]] = {"before": [], "after": []}
    with tempfile.TemporaryDirectory(prefix="bootseer-sim-ab-") as tmp:
        trees = {side: export(rev, Path(tmp) / side) for side, rev in
                 (("before", args.before), ("after", args.after))}
        out = Path(tmp) / "out"
        for tree in trees.values():  # warm-up (and the compiled build), not counted
            run(tree, args.scenario, args.nodes, args.engine, out)
        for i in range(args.rounds):
            for side in (("before", "after") if i % 2 == 0 else ("after", "before")):
                runs[side].append(run(trees[side], args.scenario, args.nodes, args.engine, out))
                print(f"{side}: {runs[side][-1]['cpu_seconds']} CPU s", file=sys.stderr)
    results = [{k: v for k, v in r.items() if k not in COST} for rs in runs.values() for r in rs]
    cpu = {side: statistics.median(r["cpu_seconds"] for r in rs) for side, rs in runs.items()}
    wall = {side: statistics.median(r["wall_seconds"] for r in rs) for side, rs in runs.items()}
    print(json.dumps({
        "bench": "sim_ab", "scenario": args.scenario, "nodes": args.nodes,
        "engine": args.engine, "before": args.before, "after": args.after,
        "rounds": args.rounds,
        "before_cpu_seconds": [r["cpu_seconds"] for r in runs["before"]],
        "after_cpu_seconds": [r["cpu_seconds"] for r in runs["after"]],
        "before_wall_seconds": [r["wall_seconds"] for r in runs["before"]],
        "after_wall_seconds": [r["wall_seconds"] for r in runs["after"]],
        "before_cpu_median": cpu["before"], "after_cpu_median": cpu["after"],
        "before_wall_median": wall["before"], "after_wall_median": wall["after"],
        "speedup": round(cpu["before"] / cpu["after"], 3),
        "same_results": all(r == results[0] for r in results),
        "swarm_calls": [runs["before"][0]["swarm_calls"], runs["after"][0]["swarm_calls"]],
        "p99": runs["after"][0]["p99"],
        "load_average": round(os.getloadavg()[0], 2),
    }))


if __name__ == "__main__":
    main()
