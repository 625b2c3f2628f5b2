"""A sweep on a local Dask cluster against the same runs one after another.

    python benchmarks/sim_sweep.py [--scenario small] [--runs 16] [--workers 2] [--pairs 1]
        [--commands]

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

`--commands` measures instead what a user types: `bootseer sim SCENARIO --seed S
--out DIR --json` once per seed, one after another (as each point of a study was
run before sweeps), against one `bootseer sim sweep FILE --out DIR --workers N`;
both on the default (compiled) engine, whose build is made before the first pair,
each pair in the other order than the one before. The in-process baseline is the
stricter one: it leaves out what every command pays (an interpreter, the imports,
the compiled engine's child, writing the results and plots).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from simulations import compiled, hugearena, report
from simulations.sweep import data
from simulations.sweep.run import client_for, execute, load, run_serially

MACHINE = {"wall_seconds", "cpu_seconds", "peak_rss_mb", "engine"}
BOOTSEER = str(Path(sys.executable).with_name("bootseer"))  # this installation's command


def _same(summary: dict[str, object]) -> dict[str, object]:
    line = json.loads(report.json_line(dict(summary)))
    return {k: v for k, v in line.items() if k not in MACHINE}


def _sweep_file(tmp: str, scenario: str, runs: int) -> Path:
    sweep = Path(tmp) / "sweep.toml"
    sweep.write_text(f'[sweep]\nscenario = "{scenario}"\nseeds = {{start = 1, stop = {runs}}}\n')
    return sweep


def _check(expected: dict[str, dict[str, object]], out: Path) -> None:
    """Raise RuntimeError unless the sweep in `out` gave every summary of `expected`."""
    rows = {r["run"]: r for r in data.read_runs(out).to_pylist()}
    for name, summary in expected.items():
        if name not in rows or (_same({k: rows[name][k] for k in summary if k not in MACHINE})
                                != _same(summary)):
            raise RuntimeError(f"run {name} differs between the sweep and the serial run")


def commands_pair(runs: int, scenario: str, workers: int,
                  sweep_first: bool) -> tuple[float, float]:
    """(seconds of the `bootseer sim` commands one after another, seconds of one `bootseer
    sim sweep` command); raises RuntimeError if a command fails or the runs differ."""
    with tempfile.TemporaryDirectory(prefix="sim-sweep-bench-") as tmp:
        sweep = _sweep_file(tmp, scenario, runs)
        names = {p.seed: p.name for p in load(str(sweep)).runs}

        def serial() -> dict[str, dict[str, object]]:
            found = {}
            for seed, name in names.items():
                out = subprocess.run([BOOTSEER, "sim", scenario, "--seed", str(seed), "--json",
                                      "--out", f"{tmp}/serial-{seed}"], capture_output=True,
                                     text=True)
                if out.returncode != 0:
                    raise RuntimeError(f"bootseer sim failed: {out.stderr.strip()}")
                found[name] = json.loads(out.stdout.strip().splitlines()[-1])
            return found

        def swept() -> None:
            out = subprocess.run([BOOTSEER, "sim", "sweep", str(sweep), "--out", f"{tmp}/sweep",
                                  "--workers", str(workers)], capture_output=True, text=True)
            if out.returncode != 0:
                raise RuntimeError(f"bootseer sim sweep failed: {out.stderr.strip()}")

        times: dict[str, float] = {}
        for arm in (("sweep", "serial") if sweep_first else ("serial", "sweep")):
            started = time.perf_counter()
            if arm == "serial":
                summaries = serial()
            else:
                swept()
            times[arm] = time.perf_counter() - started
        _check(summaries, Path(tmp) / "sweep")
    return times["serial"], times["sweep"]


def pair(runs: int, scenario: str, workers: int) -> tuple[float, float]:
    """(serial seconds, sweep seconds) of one pair; raises RuntimeError if they differ."""
    with tempfile.TemporaryDirectory(prefix="sim-sweep-bench-") as tmp:
        loaded = load(str(_sweep_file(tmp, scenario, runs)))
        started = time.perf_counter()
        serial = run_serially(loaded)
        serial_s = time.perf_counter() - started

        started = time.perf_counter()
        with client_for(None, workers) as client:
            outcome = execute(loaded, Path(tmp) / "out", client, None)
        sweep_s = time.perf_counter() - started
        if outcome.failed or len(outcome.finished) != runs:
            raise RuntimeError(f"sweep did not finish: {outcome}")
        _check(serial, Path(tmp) / "out")
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
    ap.add_argument("--commands", action="store_true",
                    help="time the commands a user types (see the module docstring)")
    args = ap.parse_args()
    if args.commands:  # the compiled engine's build, made before anything is timed
        with tempfile.TemporaryDirectory(prefix="sim-sweep-bench-") as tmp:
            subprocess.run([BOOTSEER, "sim",
                            args.scenario, "--json", "--out", tmp], capture_output=True,
                           check=True)
    times = []
    for i in range(args.pairs):
        try:
            times.append(commands_pair(args.runs, args.scenario, args.workers, i % 2 == 1)
                         if args.commands else pair(args.runs, args.scenario, args.workers))
        except RuntimeError as exc:
            print(exc, file=sys.stderr)
            return 1
    ratios = [round(b / a, 3) for a, b in times]
    print(json.dumps({
        "bench": "sim_sweep", "scenario": args.scenario, "runs": args.runs,
        "baseline": "commands" if args.commands else "in_process",
        "workers": args.workers, "serial_s": [round(a, 2) for a, _ in times],
        "sweep_s": [round(b, 2) for _, b in times], "sweep_over_serial": ratios,
        "median_ratio": statistics.median(ratios), "target": 0.6, "identical": True,
        "allocator": "pymalloc_huge_arenas" if arenas else os.environ.get("PYTHONMALLOC"),
        "host_cpus": os.cpu_count(), "load_avg_1m": round(os.getloadavg()[0], 2)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
