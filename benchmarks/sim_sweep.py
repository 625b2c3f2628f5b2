"""A sweep on a local Dask cluster against the same runs one after another.

    python benchmarks/sim_sweep.py [--scenario small] [--runs 16] [--workers 2] [--pairs 1]

Runs `--runs` seeds of the scenario twice in this one invocation: one after
another in this process (the baseline: `simulations.sweep.run.run_point`, the
very function each task runs, in plain Python), then as `bootseer sim sweep
--engine python` does, on a LocalCluster of `--workers` processes, timed from
starting the cluster to its close. Checks that both gave the same summaries,
then prints one JSON line with both times and their ratio (issue 37's target:
at most 0.6 with two workers). `--pairs N` repeats the pair N times, baseline
and sweep alternating, and reports every ratio and their median: on a machine
shared with other work one pair says little. The baseline runs on the allocator
the local workers get (simulations.hugearena: huge pages), so that the ratio
compares the same work: the script re-executes itself once on that environment.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from simulations import compiled, hugearena, report
from simulations.sweep import data
from simulations.sweep.run import client_for, execute, load, run_serially

MACHINE = {"wall_seconds", "cpu_seconds", "peak_rss_mb", "engine"}


def _same(summary: dict[str, object]) -> dict[str, object]:
    line = json.loads(report.json_line(dict(summary)))
    return {k: v for k, v in line.items() if k not in MACHINE}


def pair(runs: int, scenario: str, workers: int) -> tuple[float, float]:
    """(serial seconds, sweep seconds) of one pair; raises RuntimeError if they differ."""
    with tempfile.TemporaryDirectory(prefix="sim-sweep-bench-") as tmp:
        sweep = Path(tmp) / "sweep.toml"
        sweep.write_text(f'[sweep]\nscenario = "{scenario}"\n'
                         f"seeds = {{start = 1, stop = {runs}}}\n")
        loaded = load(str(sweep))
        started = time.perf_counter()
        serial = run_serially(loaded)
        serial_s = time.perf_counter() - started

        started = time.perf_counter()
        with client_for(None, workers) as client:
            outcome = execute(loaded, Path(tmp) / "out", client, None)
        sweep_s = time.perf_counter() - started
        if outcome.failed or len(outcome.finished) != runs:
            raise RuntimeError(f"sweep did not finish: {outcome}")
        rows = {r["run"]: r for r in data.read_runs(Path(tmp) / "out").to_pylist()}
        for name, summary in serial.items():
            if _same({k: rows[name][k] for k in summary if k not in MACHINE}) != _same(summary):
                raise RuntimeError(f"run {name} differs between the sweep and the serial run")
    return serial_s, sweep_s


def on_the_workers_allocator() -> bool:
    """This process on the allocator of the sweep's local workers (simulations.sweep.run);
    whether pymalloc's arenas are on huge pages."""
    wanted = hugearena.environ(os.environ, hugearena.built_in(compiled.source_root()))
    if wanted != dict(os.environ):
        os.execve(sys.executable, [sys.executable, *sys.argv], wanted)
    return hugearena.install()


def main() -> int:
    arenas = on_the_workers_allocator()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", default="small")
    ap.add_argument("--runs", type=int, default=16)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--pairs", type=int, default=1)
    args = ap.parse_args()
    times = []
    for _ in range(args.pairs):
        try:
            times.append(pair(args.runs, args.scenario, args.workers))
        except RuntimeError as exc:
            print(exc, file=sys.stderr)
            return 1
    ratios = [round(b / a, 3) for a, b in times]
    print(json.dumps({
        "bench": "sim_sweep", "scenario": args.scenario, "runs": args.runs,
        "workers": args.workers, "serial_s": [round(a, 2) for a, _ in times],
        "sweep_s": [round(b, 2) for _, b in times], "sweep_over_serial": ratios,
        "median_ratio": statistics.median(ratios), "target": 0.6, "identical": True,
        "allocator": "pymalloc_huge_arenas" if arenas else os.environ.get("PYTHONMALLOC"),
        "host_cpus": os.cpu_count(), "load_avg_1m": round(os.getloadavg()[0], 2)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
