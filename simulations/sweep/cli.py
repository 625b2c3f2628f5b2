"""`bootseer sim sweep` and `bootseer sim report` (see simulations.cli for the usage)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from p2p.errors import UserError
from simulations.sweep import data
from simulations.sweep.plan import SweepError
from simulations.sweep.run import Outcome, Progress, client_for, execute, load


def run(args: argparse.Namespace) -> int:
    if args.target is None:
        raise UserError(f"`sim {args.scenario}` needs "
                        f"{'a sweep file' if args.scenario == 'sweep' else 'a directory'}")
    if args.scenario == "report":
        return report(Path(args.target), args.json)
    if args.out is None:
        raise UserError("--out DIR is required")
    if args.workers is not None and args.workers < 1:
        raise UserError("--workers must be at least 1")
    try:
        loaded = load(args.target)
        progress = Progress() if sys.stderr.isatty() else None
        with client_for(args.scheduler, args.workers) as client:
            outcome = execute(loaded, args.out, client, progress)
    except SweepError as exc:
        raise UserError(str(exc)) from None
    except OSError as exc:
        raise UserError(f"cannot write results to {args.out}: {exc.strerror or exc}") from None
    plots = data.plot(args.out) if outcome.finished or outcome.skipped else []
    _tell(outcome, args.out, len(plots), args.json)
    if outcome.interrupted:
        return 130
    return 1 if outcome.failed or outcome.incomplete else 0


def report(out: Path, as_json: bool) -> int:
    if not (out / "sweep.json").is_file():
        raise UserError(f"{out}: not a sweep's output directory (no sweep.json)")
    plots = data.plot(out)
    rows = data.read_runs(out).num_rows
    planned = len(data.read_description(out)["runs"])
    if as_json:
        print(json.dumps({"out": str(out), "runs": rows, "planned": planned,
                          "plots": [str(p) for p in plots]}))
    else:
        print(f"{rows} of {planned} runs; {len(plots)} plots in {out / 'plots'}")
    return 0 if rows == planned else 1


def _tell(outcome: Outcome, out: Path, plots: int, as_json: bool) -> None:
    for point, error in outcome.failed:
        params = ", ".join(f"{k} = {v}" for k, v in point.params)
        print(f"bootseer sim sweep: run {point.name} ({params}, seed {point.seed}) failed: "
              f"{error}", file=sys.stderr)
    for point, stop in outcome.incomplete:
        print(f"bootseer sim sweep: run {point.name} did not finish: {stop}", file=sys.stderr)
    if outcome.interrupted:
        print(f"bootseer sim sweep: stopped; {outcome.skipped + len(outcome.finished)} of "
              f"{outcome.planned} runs are in {out}; the same command runs the rest",
              file=sys.stderr)
    line = {"out": str(out), "planned": outcome.planned, "skipped": outcome.skipped,
            "ran": len(outcome.finished), "failed": len(outcome.failed),
            "incomplete": len(outcome.incomplete), "interrupted": outcome.interrupted,
            "plots": plots}
    if as_json:
        print(json.dumps(line))
    else:
        print(f"{outcome.planned} runs: {outcome.skipped} already done, "
              f"{len(outcome.finished)} ran, {len(outcome.failed)} failed; results and "
              f"{plots} plots in {out}")
