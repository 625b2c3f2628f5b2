"""The simulator's own cost at several sizes: one `bootseer sim` process per size.

    python benchmarks/sim_scale.py [--scenario scale] [--nodes 1000 10000 50000]
        [--strategy NAME] [--out DIR] [--engine compiled|python] [--baseline]

Each size runs `bootseer sim SCENARIO --nodes N --out DIR/N --json` in a fresh
process, one after the other (never two at once: the sizes are timed), and
prints that JSON line as it comes, then a Markdown table of wall time, CPU
time, peak RSS, startup times and origin egress. Wall time depends on what
else the machine runs; CPU time much less so, which is why both are shown.

`--baseline` runs each size with `--engine python` too, right after, checks
that both engines computed the same run, and prints one more JSON line per
size: `{"bench": "sim_engine", ..., "python_over_compiled": CPU ratio}`.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

# What may differ between two engines' runs of one scenario: their cost.
COST = {"wall_seconds", "cpu_seconds", "peak_rss_mb", "engine", "command"}


def run(scenario: str, nodes: int, strategy: str | None, out: Path,
        engine: str) -> dict[str, Any]:
    cmd = ["bootseer", "sim", scenario, "--nodes", str(nodes), "--out",
           str(out / f"{nodes}-{engine}"), "--json", "--engine", engine]
    if strategy:
        cmd += ["--strategy", strategy]
    exe = Path(sys.executable).with_name("bootseer")
    done = subprocess.run([str(exe) if exe.exists() else cmd[0], *cmd[1:]],
                          capture_output=True, text=True)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode != 0 or not lines:
        raise SystemExit(f"{shlex.join(cmd)} failed ({done.returncode}): "
                         f"{(done.stderr or done.stdout).strip()[-400:]}")
    summary: dict[str, Any] = json.loads(lines[-1])
    summary["command"] = shlex.join(cmd)
    return summary


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| nodes | engine | wall s | CPU s | peak RSS MB | p50 s | p99 s | max s "
             "| origin egress | swarm calls |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for s in rows:
        lines.append(f"| {s['nodes']:,} | {s['engine']} | {s['wall_seconds']:.1f} "
                     f"| {s['cpu_seconds']:.1f} "
                     f"| {s['peak_rss_mb']:.0f} | {s['p50']:.2f} | {s['p99']:.2f} "
                     f"| {s['max']:.2f} | {s['origin_egress_ratio']:.2f} x "
                     f"| {s['swarm_calls']:,} |")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scenario", default="scale")
    p.add_argument("--nodes", type=int, nargs="+", default=[1000, 10000, 50000])
    p.add_argument("--strategy", default=None)
    p.add_argument("--out", type=Path, default=Path("sim-scale"))
    p.add_argument("--engine", choices=("compiled", "python"), default="compiled")
    p.add_argument("--baseline", action="store_true",
                   help="run every size with --engine python too and give the ratio")
    args = p.parse_args()
    rows = []
    for n in args.nodes:
        summary = run(args.scenario, n, args.strategy, args.out, args.engine)
        print(json.dumps(summary), flush=True)
        rows.append(summary)
        if args.baseline:
            base = run(args.scenario, n, args.strategy, args.out, "python")
            print(json.dumps(base), flush=True)
            rows.append(base)
            print(json.dumps(compare(summary, base)), flush=True)
    print(table(rows))
    return 0


def compare(fast: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    same = {k: v for k, v in fast.items() if k not in COST} == \
        {k: v for k, v in base.items() if k not in COST}
    if not same:
        raise SystemExit(f"the engines computed different runs: {fast} against {base}")
    return {"bench": "sim_engine", "scenario": fast["scenario"], "nodes": fast["nodes"],
            "engine": fast["engine"], "wall_seconds": fast["wall_seconds"],
            "cpu_seconds": fast["cpu_seconds"], "python_wall_seconds": base["wall_seconds"],
            "python_cpu_seconds": base["cpu_seconds"], "same_results": same,
            "python_over_compiled": round(base["cpu_seconds"] / fast["cpu_seconds"], 2),
            "peak_rss_mb": fast["peak_rss_mb"], "python_peak_rss_mb": base["peak_rss_mb"]}


if __name__ == "__main__":
    sys.exit(main())
