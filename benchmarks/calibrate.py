"""Calibrate the simulator against real agents: same setup, measured vs predicted.

For each N in --nodes (default 4, 8, 16, 32) this runs the real swarm bench

    bootseer bench swarm --nodes N --size S --node-cap C --origin-cap O \
        --chunk-size-mb K --racks R --json

(real agents, tracker and origin on loopback), then simulates the very same
setup: N nodes in R racks, C MB/s up and down per node, one origin of O MB/s,
K MiB chunks, every node starting at once, the agent's default swarm and
tracker settings. It compares the time until the last node completes and the
origin egress ratio, for the swarm and for the origin-only baseline, and
writes the table to simulations/CALIBRATION.md (or --out).

    python benchmarks/calibrate.py [--nodes 4 8 16 32] [--size 64MiB] ...

Targets (issue 3): predicted completion within +-15% of measured, origin
egress within +-5%.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from simulations import report
from simulations.network import NetworkSpec, OriginSpec
from simulations.scenario import Scenario, parse_size
from simulations.simulation import Simulation
from simulations.tracker import TrackerSpec
from simulations.workload import ContentKind, Workload

ROOT = Path(__file__).resolve().parents[1]
LOOPBACK_LATENCY_S = 100e-6  # one message between two local agents (asyncio, loopback)
ORIGIN_LATENCY_S = 1e-3  # first byte from the local HTTP origin
ORIGIN_CONCURRENCY = 256  # the local origin does not queue requests


def bench(nodes: int, args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    cmd = ["bootseer", "bench", "swarm", "--nodes", str(nodes), "--size", args.size,
           "--node-cap", str(args.node_cap), "--origin-cap", str(args.origin_cap),
           "--chunk-size-mb", str(args.chunk_mb), "--racks", str(args.racks), "--json"]
    exe = Path(sys.executable).with_name("bootseer")
    run = [str(exe) if exe.exists() else cmd[0], *cmd[1:]]
    done = subprocess.run(run, capture_output=True, text=True, timeout=args.timeout)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode != 0 or not lines:
        raise SystemExit(f"{shlex.join(cmd)} failed ({done.returncode}): "
                         f"{(done.stderr or done.stdout).strip()[-400:]}")
    return shlex.join(cmd), json.loads(lines[-1])


def scenario(nodes: int, args: argparse.Namespace, strategy: str) -> Scenario:
    size = int(parse_size(args.size))
    node_bps, origin_bps = args.node_cap * 1e6, args.origin_cap * 1e6
    network = NetworkSpec(
        racks=min(args.racks, nodes), nic_up_Bps=node_bps, nic_down_Bps=node_bps,
        oversubscription=1.0, same_rack_latency_s=LOOPBACK_LATENCY_S,
        cross_rack_latency_s=LOOPBACK_LATENCY_S, rate_update_s=args.rate_update_ms / 1000,
        origins=(OriginSpec("origin", origin_bps, ORIGIN_CONCURRENCY, ORIGIN_LATENCY_S),))
    workload = Workload((ContentKind("content", size, args.chunk_mb * 2**20, ("origin",)),))
    return Scenario(name="calibration", source="benchmarks/calibrate.py", nodes=nodes,
                    seed=args.seed, strategy=strategy, network=network,
                    tracker=TrackerSpec(), workload=workload)


def simulate(s: Scenario) -> dict[str, Any]:
    started = time.perf_counter()
    sim = Simulation(s)
    stop = sim.run()
    return report.collect(sim, stop, time.perf_counter() - started).summary


def pct(predicted: float, measured: float | None) -> str:
    if not measured:
        return "-"
    return f"{100 * (predicted - measured) / measured:+.1f}%"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, nargs="+", default=[4, 8, 16, 32])
    p.add_argument("--size", default="64MiB")
    p.add_argument("--node-cap", type=float, default=20.0, help="MB/s per node, each way")
    p.add_argument("--origin-cap", type=float, default=40.0, help="MB/s out of the origin")
    p.add_argument("--chunk-mb", type=int, default=4)
    p.add_argument("--racks", type=int, default=2)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--rate-update-ms", type=float, default=5.0)
    p.add_argument("--timeout", type=float, default=1800.0)
    p.add_argument("--out", type=Path, default=ROOT / "simulations" / "CALIBRATION.md")
    args = p.parse_args()

    rows, commands = [], []
    for n in args.nodes:
        command, real = bench(n, args)
        commands.append(command)
        sim = simulate(scenario(n, args, "rack_aware"))
        base = simulate(replace(scenario(n, args, "origin_only")))
        row = {"nodes": n, "real": real, "sim": sim, "base": base}
        rows.append(row)
        print(json.dumps({"nodes": n, "measured_s": real["seconds"],
                          "simulated_s": round(sim["makespan_s"], 3),
                          "measured_egress": real["origin_egress_ratio"],
                          "simulated_egress": round(sim["origin_egress_ratio"], 4),
                          "measured_baseline_s": real.get("baseline_seconds"),
                          "simulated_baseline_s": round(base["makespan_s"], 3)}), flush=True)
    args.out.write_text(table(rows, commands, args))
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


def table(rows: list[dict[str, Any]], commands: list[str], args: argparse.Namespace) -> str:
    lines = [
        "# Calibration: simulator vs real agents",
        "",
        f"Produced by `python benchmarks/calibrate.py --nodes {' '.join(map(str, args.nodes))} "
        f"--size {args.size} --node-cap {args.node_cap:g} --origin-cap {args.origin_cap:g} "
        f"--chunk-mb {args.chunk_mb} --racks {args.racks}` on {time.strftime('%Y-%m-%d')}.",
        "Measured: `bootseer bench swarm` (real agents, tracker and origin on loopback).",
        "Simulated: the same setup in `simulations` (time until the last node completes).",
        "Targets: completion within +-15%, origin egress within +-5%.",
        "",
        "| N | measured s | simulated s | error | measured egress | simulated egress | error "
        "| baseline measured s | baseline simulated s | error | bound s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        real, sim, base = r["real"], r["sim"], r["base"]
        lines.append(
            f"| {r['nodes']} | {real['seconds']:.2f} | {sim['makespan_s']:.2f} "
            f"| {pct(sim['makespan_s'], real['seconds'])} "
            f"| {real['origin_egress_ratio']:.3f} | {sim['origin_egress_ratio']:.3f} "
            f"| {pct(sim['origin_egress_ratio'], real['origin_egress_ratio'])} "
            f"| {real.get('baseline_seconds') or '-'} | {base['makespan_s']:.2f} "
            f"| {pct(base['makespan_s'], real.get('baseline_seconds'))} "
            f"| {real.get('bound_seconds') or '-'} |")
    lines += ["", "Commands run for the measured columns:", ""]
    lines += [f"    {c}" for c in commands]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
