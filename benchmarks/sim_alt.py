"""Several revisions of the simulator in turn: the CPU of the event loop alone.

    python benchmarks/sim_alt.py REV [REV ...] [--rounds 6] [--scenario launch]
        [--nodes 1000]

Exports each revision's tree (benchmarks/ab.py's `export`), builds its compiled
engine (simulations.compiled, in a cache of this run's own, so that builds of
other sessions are not pruned), then runs the scenario once per revision per
round, the order reversed every other round (ABBA for two revisions), each in a
fresh process on that build. Each run reports the CPU time of the main thread
during `Simulation.run` only: the imports, the setup, the report and numpy's
BLAS threads stay out of the figure, which on this shared machine moved `sim_ab`'s
whole-process CPU seconds by 15-25% between runs minutes apart. Prints one JSON
line per run and a last one with each revision's runs and median, and whether
every revision made the same run (swarm calls, nodes ready, virtual end time).
`benchmarks/sim_ab.py` remains the check that every summary figure agrees.
Each process gets the environment `bootseer sim` gives its child
(`simulations.compiled.child_env`): glibc's malloc on huge pages, since an exported
tree holds no built arena module; `PYTHONMALLOC=pymalloc` measures CPython's own
allocator instead, and `benchmarks/sim_alloc.py` compares allocators.
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

from simulations.compiled import child_env

# Run in the child, on the build: the loop's own CPU, and what identifies the run.
# The child each run is (benchmarks/sim_loop_child.py).
CHILD = str(Path(__file__).with_name("sim_loop_child.py"))


def build(tree: Path, cache: Path) -> Path:
    env = {**os.environ, "PYTHONPATH": str(tree), "BOOTSEER_CACHE": str(cache)}
    made = subprocess.run([sys.executable, "-c", "import sys; from pathlib import Path; "
                           "from simulations import compiled; "
                           "print(compiled.build(Path(sys.argv[1])))", str(tree)],
                          env=env, capture_output=True, text=True, check=True)
    return Path(made.stdout.strip().splitlines()[-1])


def run(built: Path, scenario: str, nodes: int) -> dict[str, Any]:
    # The environment `bootseer sim` gives its child (simulations.compiled.child_env): an
    # exported tree holds no built arena module, so every revision runs on glibc's malloc
    # on huge pages, unless the caller set PYTHONMALLOC (`pymalloc`: CPython's own).
    env = child_env(built)
    done = subprocess.run([sys.executable, "-P", CHILD, scenario, str(nodes)],
                          env=env, capture_output=True, text=True, cwd=built)
    if done.returncode != 0:
        raise SystemExit(f"run on {built} failed:\n{done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("revs", nargs="+", help="git revisions, run in this order")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--scenario", default="launch")
    parser.add_argument("--nodes", type=int, default=1000)
    args = parser.parse_args()
    runs: dict[str, list[dict[str, Any]]] = {rev: [] for rev in args.revs}
    with tempfile.TemporaryDirectory(prefix="bootseer-sim-alt-") as tmp:
        # (one build per revision: more than the cache's three, so no pruning)
        builds = {rev: build(export(rev, Path(tmp) / f"tree{i}"), Path(tmp) / f"cache{i}")
                  for i, rev in enumerate(args.revs)}
        for i in range(args.rounds):
            for rev in args.revs if i % 2 == 0 else args.revs[::-1]:
                runs[rev].append(run(builds[rev], args.scenario, args.nodes))
                print(json.dumps({"rev": rev, "load_average": os.getloadavg()[0],
                                  **runs[rev][-1]}), flush=True)
    cpu = {rev: [r["run_cpu_seconds"] for r in rs] for rev, rs in runs.items()}
    print(json.dumps({
        "bench": "sim_alt", "scenario": args.scenario, "nodes": args.nodes,
        "rounds": args.rounds, "run_cpu_seconds": cpu,
        "median": {rev: statistics.median(c) for rev, c in cpu.items()},
        "same_run": len({json.dumps(r["same"]) for rs in runs.values() for r in rs}) == 1,
        "load_average": os.getloadavg()[0],
    }))


if __name__ == "__main__":
    main()
