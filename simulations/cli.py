"""`bootseer sim`: run a scenario, write its results, print a summary.

    bootseer sim SCENARIO [--nodes N] [--seed S] [--strategy NAME] --out DIR [--json]
                 [--engine compiled|python]
    bootseer sim sweep SWEEP --out DIR [--scheduler ADDRESS] [--workers N] [--json]
    bootseer sim report DIR

`sim sweep` runs every run of a sweep file (simulations.sweep.plan; a path or
a bundled sweep's name) as a task on Dask: a local cluster of `--workers`
processes (default one per core), or the cluster at `--scheduler`. Runs
already in DIR are skipped, so the same command resumes a stopped sweep.
`sim report DIR` redraws a sweep's plots from its Parquet dataset.

SCENARIO is a TOML file or the name of a bundled scenario (simulations/
scenarios/). The run writes nodes.parquet, summary.json and three PNG plots
into DIR. `--json` prints the summary as one JSON line instead of a table.
Progress goes to stderr when it is a terminal. The default engine runs the
same code compiled with mypyc (`simulations.compiled`: built once per source
version, results identical, 1.6-1.7x faster at 10,000 nodes); `--engine python`
runs it as plain Python, as the profilers need.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from collections.abc import Callable
from pathlib import Path

from p2p.errors import UserError
from simulations import compiled, report
from simulations.scenario import ScenarioError, bundled, load, override
from simulations.simulation import Simulation
from simulations.strategy import STRATEGIES

PROGRESS_EVERY = 200_000  # callbacks between progress lines
ENGINES = ("compiled", "python")


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("sim", help="simulate a launch on virtual time with the real policies",
                       description=__doc__.splitlines()[0])
    p.add_argument("scenario", metavar="SCENARIO",
                   help=f"a TOML file, or a bundled scenario ({', '.join(bundled())}); "
                        "or `sweep` or `report`")
    p.add_argument("target", nargs="?", metavar="SWEEP|DIR",
                   help="with `sweep`, the sweep file (or a bundled sweep); with `report`, "
                        "a sweep's output directory")
    p.add_argument("--nodes", type=int, help="override [run] nodes")
    p.add_argument("--seed", type=int, help="override [run] seed")
    p.add_argument("--strategy", choices=sorted(STRATEGIES), help="override [run] strategy")
    p.add_argument("--out", type=Path, help="directory for the results")
    p.add_argument("--json", action="store_true", help="print one JSON summary line")
    p.add_argument("--engine", choices=ENGINES, default="compiled",
                   help="compiled (mypyc, built once per source version; the default) or "
                        "python; for a sweep, what local workers run (a cluster's workers "
                        "run what they have)")
    p.add_argument("--scheduler", metavar="ADDRESS",
                   help="sweep: a Dask scheduler's address (default: a local cluster)")
    p.add_argument("--workers", type=int, metavar="N",
                   help="sweep: local worker processes (default: one per core); with "
                        "--scheduler, wait for N workers")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.scenario in ("sweep", "report"):
        from simulations.sweep import cli as sweep_cli

        for flag in ("nodes", "seed", "strategy"):
            if getattr(args, flag) is not None:
                raise UserError(f"--{flag} is not a `sim {args.scenario}` option; a sweep "
                                "file sets it for every run ([set])")
        return sweep_cli.run(args)
    if args.target is not None or args.scheduler is not None or args.workers is not None:
        raise UserError("SWEEP|DIR, --scheduler and --workers go with `sim sweep`/`sim report`")
    if args.out is None:
        raise UserError("--out DIR is required")
    try:
        scenario = override(load(args.scenario), nodes=args.nodes, seed=args.seed,
                            strategy=args.strategy)
    except ScenarioError as exc:
        raise UserError(str(exc)) from None
    if scenario.nodes < 1:
        raise UserError("--nodes must be at least 1")
    if args.engine == "compiled" and not compiled.active():
        try:
            build = compiled.build()
        except compiled.BuildError as exc:
            print(f"bootseer sim: cannot build the compiled engine ({exc}); running in plain "
                  "Python, which takes 1.6-1.7x as long", file=sys.stderr)
        else:
            return compiled.run_child(build, _argv(args))
    started = time.perf_counter()
    sim = Simulation(scenario)
    hook = (PROGRESS_EVERY, _progress(sim, started)) if sys.stderr.isatty() else None
    stop = sim.run(progress=hook)
    # The run's millions of objects outlive it until the process ends, and make no
    # cycles (Simulation.run): without this, the collector, enabled again, scanned them
    # all several times over while the results were written (5 s of a 10,000-node run).
    gc.freeze()
    if hook is not None:
        print(file=sys.stderr)
    result = report.collect(sim, stop, time.perf_counter() - started)
    result.summary["engine"] = "compiled" if compiled.active() else "python"
    try:
        report.write(result, args.out)
    except OSError as exc:
        raise UserError(f"cannot write results to {args.out}: {exc.strerror}") from None
    if args.json:
        print(report.json_line(result.summary))
    else:
        _table(result.summary, args.out)
    if stop != "complete":
        print(f"bootseer sim: stopped: {stop}", file=sys.stderr)
        return 1
    return 0


def _argv(args: argparse.Namespace) -> list[str]:
    """The command line of this run for the child that runs it on the compiled build. It
    says `--engine python` so that the child never builds or starts another; the summary's
    `engine` says which modules it ran."""
    argv = ["sim", args.scenario, "--out", str(args.out), "--engine", "python"]
    for flag in ("nodes", "seed", "strategy"):
        if getattr(args, flag) is not None:
            argv += [f"--{flag}", str(getattr(args, flag))]
    return argv + (["--json"] if args.json else [])


def _progress(sim: Simulation, started: float) -> Callable[[], None]:
    def show() -> None:
        wall = time.perf_counter() - started
        print(f"\r  t={sim.loop.now:8.1f} s virtual  ready {sim.ready}/{len(sim.nodes)}  "
              f"flows {sim.flows.active:7d}  wall {wall:6.1f} s", end="", file=sys.stderr)
    return show


def _table(s: dict[str, object], out: Path) -> None:
    def gib(key: str) -> str:
        value = s[key]
        return f"{float(value) / 2**30:.1f} GiB" if isinstance(value, int | float) else "-"
    rows = [
        ("scenario", f"{s['scenario']} ({s['strategy']}, seed {s['seed']})"),
        ("nodes", f"{s['nodes']} ({s['ready_nodes']} ready, {s['failed_nodes']} failed)"),
        ("startup p50/p99/max", f"{s['p50']:.2f} / {s['p99']:.2f} / {s['max']:.2f} s"),
        ("last node ready at", f"{s['makespan_s']:.2f} s"),
        ("origin egress", f"{gib('origin_egress_bytes')} ({s['origin_egress_ratio']:.2f} x)"),
        ("same / cross rack", f"{gib('same_rack_bytes')} / {gib('cross_rack_bytes')}"),
        ("wall, CPU, peak RSS", f"{s['wall_seconds']:.1f} s, {s['cpu_seconds']:.1f} s, "
                                f"{s['peak_rss_mb']:.0f} MB"),
        ("results", str(out)),
    ]
    for name, value in rows:
        print(f"{name:>22}  {value}")
