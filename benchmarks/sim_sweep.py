"""A sweep on a local Dask cluster against the same runs one after another.

    python benchmarks/sim_sweep.py [--scenario small] [--runs 16] [--workers 2]

Runs `--runs` seeds of the scenario twice in this one invocation: one after
another in this process (the baseline: `simulations.sweep.run.run_point`, the
very function each task runs), then as `bootseer sim sweep` does, on a
LocalCluster of `--workers` processes, timed from starting the cluster to the
last run written. Checks that both gave the same summaries, then prints one
JSON line with both times and their ratio (issue 37's target: at most 0.6 with
two workers). On a machine shared with other work, the ratio is what counts.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from simulations import report
from simulations.sweep import data
from simulations.sweep.run import client_for, execute, load, run_serially

MACHINE = {"wall_seconds", "cpu_seconds", "peak_rss_mb", "engine"}


def _same(summary: dict[str, object]) -> dict[str, object]:
    line = json.loads(report.json_line(dict(summary)))
    return {k: v for k, v in line.items() if k not in MACHINE}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", default="small")
    ap.add_argument("--runs", type=int, default=16)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="sim-sweep-bench-") as tmp:
        sweep = Path(tmp) / "sweep.toml"
        sweep.write_text(f'[sweep]\nscenario = "{args.scenario}"\n'
                         f"seeds = {{start = 1, stop = {args.runs}}}\n")
        loaded = load(str(sweep))
        started = time.perf_counter()
        serial = run_serially(loaded)
        serial_s = time.perf_counter() - started

        started = time.perf_counter()
        with client_for(None, args.workers) as client:
            outcome = execute(loaded, Path(tmp) / "out", client, None)
        sweep_s = time.perf_counter() - started
        if outcome.failed or len(outcome.finished) != args.runs:
            print(f"sweep did not finish: {outcome}", file=sys.stderr)
            return 1
        rows = {r["run"]: r for r in data.read_runs(Path(tmp) / "out").to_pylist()}
        for name, summary in serial.items():
            if _same({k: rows[name][k] for k in summary if k not in MACHINE}) != _same(summary):
                print(f"run {name} differs between the sweep and the serial run",
                      file=sys.stderr)
                return 1
    print(json.dumps({
        "bench": "sim_sweep", "scenario": args.scenario, "runs": args.runs,
        "workers": args.workers, "serial_s": round(serial_s, 2), "sweep_s": round(sweep_s, 2),
        "sweep_over_serial": round(sweep_s / serial_s, 3), "target": 0.6,
        "identical": True, "host_cpus": os.cpu_count(),
        "load_avg_1m": round(os.getloadavg()[0], 2)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
