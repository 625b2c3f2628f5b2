"""The simulator's own cost at several sizes: one `bootseer sim` process per size.

    python benchmarks/sim_scale.py [--scenario scale] [--nodes 1000 10000 50000]
        [--strategy NAME] [--out DIR]

Each size runs `bootseer sim SCENARIO --nodes N --out DIR/N --json` in a fresh
process, one after the other (never two at once: the sizes are timed), and
prints that JSON line as it comes, then a Markdown table of wall time, CPU
time, peak RSS, startup times and origin egress. Wall time depends on what
else the machine runs; CPU time much less so, which is why both are shown.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any


def run(scenario: str, nodes: int, strategy: str | None, out: Path) -> dict[str, Any]:
    cmd = ["bootseer", "sim", scenario, "--nodes", str(nodes), "--out", str(out / str(nodes)),
           "--json"]
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
    lines = ["| nodes | wall s | CPU s | peak RSS MB | p50 s | p99 s | max s | origin egress "
             "| swarm calls |",
             "|---|---|---|---|---|---|---|---|---|"]
    for s in rows:
        lines.append(f"| {s['nodes']:,} | {s['wall_seconds']:.1f} | {s['cpu_seconds']:.1f} "
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
    args = p.parse_args()
    rows = []
    for n in args.nodes:
        summary = run(args.scenario, n, args.strategy, args.out)
        print(json.dumps(summary), flush=True)
        rows.append(summary)
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
