"""The simulator's loop on each allocator in turn: its CPU, and how much sat on huge pages.

    python benchmarks/sim_alloc.py [--variants glibc_thp,hugearena] [--rounds 4]
        [--scenario launch] [--nodes 2000]

Builds this tree's compiled engine (simulations.compiled, in a cache of this run's
own), then runs the scenario once per variant per round, the order reversed every
other round (ABBA for two), each in a fresh process on that build whose
environment is the variant's:

- `glibc_thp`: glibc's malloc on transparent huge pages (`PYTHONMALLOC=malloc`,
  `GLIBC_TUNABLES=glibc.malloc.hugetlb=1`), the fallback of simulations.hugearena;
- `hugearena`: pymalloc with its arenas on huge pages (simulations._hugearena,
  installed first thing) and the same tunables for what pymalloc hands to glibc;
- `pymalloc`: CPython's allocator as it comes (`PYTHONMALLOC=pymalloc`).

Each run reports the CPU and wall time of `Simulation.run` alone (as
`benchmarks/sim_alt.py` does) and, read from /proc/self/smaps after the run, the
MB on huge pages in the arena regions and in the whole process. Prints one JSON
line per run and a last one with each variant's runs, medians and whether every
run was the same run (swarm calls, nodes ready, virtual end time).
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

from simulations import compiled, hugearena

# The child each run is (benchmarks/sim_loop_child.py).
CHILD = str(Path(__file__).with_name("sim_loop_child.py"))


def variant_env(name: str, build: Path) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if k not in ("PYTHONMALLOC", "GLIBC_TUNABLES")}
    base["PYTHONPATH"] = str(build)
    if name == "pymalloc":
        return dict(base, PYTHONMALLOC="pymalloc")
    return hugearena.environ(base, arenas=name == "hugearena")


def run(build: Path, variant: str, scenario: str, nodes: int) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-P", CHILD, scenario, str(nodes)],
                          env=variant_env(variant, build), capture_output=True, text=True,
                          cwd=build)
    if done.returncode != 0:
        raise SystemExit(f"{variant} run failed:\n{done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    if result["arenas_installed"] != (variant == "hugearena"):
        raise SystemExit(f"{variant}: arenas installed = {result['arenas_installed']}")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variants", default="glibc_thp,hugearena")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--scenario", default="launch")
    parser.add_argument("--nodes", type=int, default=2000)
    args = parser.parse_args()
    variants = args.variants.split(",")
    if not set(variants) <= {"glibc_thp", "hugearena", "pymalloc"}:
        raise SystemExit(f"--variants: glibc_thp, hugearena or pymalloc, not {variants}")
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
    loads = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory(prefix="bootseer-sim-alloc-") as tmp:
        build = compiled.build(cache=Path(tmp))
        if not hugearena.built_in(build):
            raise SystemExit("the build holds no simulations._hugearena: pip install -e .")
        for i in range(args.rounds):
            for variant in variants if i % 2 == 0 else variants[::-1]:
                runs[variant].append(run(build, variant, args.scenario, args.nodes))
                loads.append(os.getloadavg()[0])
                print(json.dumps({"variant": variant, "load_average": loads[-1],
                                  **runs[variant][-1]}), flush=True)
    cpu = {v: [r["run_cpu_seconds"] for r in rs] for v, rs in runs.items()}
    print(json.dumps({
        "bench": "sim_alloc", "scenario": args.scenario, "nodes": args.nodes,
        "rounds": args.rounds, "run_cpu_seconds": cpu,
        "run_wall_seconds": {v: [r["run_wall_seconds"] for r in rs] for v, rs in runs.items()},
        "median": {v: statistics.median(c) for v, c in cpu.items()},
        "arena_huge_mb": {v: [r["arena_huge_mb"] for r in rs] for v, rs in runs.items()},
        "huge_mb": {v: [r["huge_mb"] for r in rs] for v, rs in runs.items()},
        "same_run": len({json.dumps(r["same"]) for rs in runs.values() for r in rs}) == 1,
        "load_average": [min(loads), max(loads)],
    }))


if __name__ == "__main__":
    main()
