"""Where a compiled run's time goes: perf's samples, charged to the compiled functions.

    python benchmarks/sim_perf.py [SCENARIO] [--nodes N] [--hz 150] [--top 40]

Runs `bootseer sim SCENARIO` (the compiled engine, as a user runs it) under
`perf record -e cpu-clock --call-graph dwarf`, then reads every sample's stack
and keeps those taken inside the event loop (`engine.Loop.run`). For each
function mypyc compiled it prints its inclusive share (samples with it anywhere on
the stack) and its own share (samples whose nearest compiled frame it is: the
time in the interpreter's dict, list and allocation calls it makes is its own),
then one JSON line with both tables.

cProfile and py-spy do not see into a compiled build; perf does, at any size
(10,000 nodes included), if it can unwind through the interpreter. It could not
through the shared libpython of a pyenv build without frame information for it
(every sample in libpython stopped there); it can through Debian's
/usr/bin/python3, so on such a machine run this script from a virtualenv made from
that one (`/usr/bin/python3 -m venv DIR && DIR/bin/pip install -e '.[sim]'`). The
script says how many samples it could not place.
Needs `perf` (Debian: linux-perf) and about 15 MB of disk per 1,000 samples.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

LOOP = "engine___Loop___run"
BOOTSEER = str(Path(sys.executable).with_name("bootseer"))  # this installation's command


def stacks(perf_data: Path) -> Iterator[list[str]]:
    """Every sample's stack, leaf first, as symbol names."""
    script = subprocess.run(["perf", "script", "-i", str(perf_data), "-F", "ip,sym"],
                            capture_output=True, text=True, check=True).stdout
    stack: list[str] = []
    for line in script.splitlines():
        fields = line.split(None, 1)
        if not fields:
            if stack:
                yield stack
            stack = []
            continue
        stack.append(fields[1] if len(fields) > 1 else "?")
    if stack:
        yield stack


def compiled_name(symbol: str) -> str | None:
    """`module___Class___method` for a function mypyc compiled (its C or its Python
    entry point), else None."""
    for prefix in ("CPyDef_", "CPyPy_"):
        if symbol.startswith(prefix):
            return symbol[len(prefix):]
    return None


def shares(perf_data: Path) -> tuple[int, int, Counter[str], Counter[str]]:
    """Samples, samples in the loop, and the inclusive and own counts per function."""
    total = in_loop = 0
    inclusive: Counter[str] = Counter()
    own: Counter[str] = Counter()
    for stack in stacks(perf_data):
        total += 1
        names = [n for n in map(compiled_name, stack) if n is not None]
        if LOOP not in names:
            continue
        in_loop += 1
        own[names[0]] += 1
        inclusive.update(set(names))
    return total, in_loop, inclusive, own


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("scenario", nargs="?", default="launch-10k")
    parser.add_argument("--nodes", type=int, default=None)
    parser.add_argument("--hz", type=int, default=150, help="samples per second")
    parser.add_argument("--top", type=int, default=40)
    args = parser.parse_args()
    if shutil.which("perf") is None:
        raise SystemExit("sim_perf: perf is not installed (Debian: apt-get install linux-perf)")
    with tempfile.TemporaryDirectory(prefix="bootseer-sim-perf-") as tmp:
        data = Path(tmp) / "perf.data"
        command = [BOOTSEER, "sim", args.scenario, "--json", "--out", str(Path(tmp) / "out")]
        if args.nodes is not None:
            command += ["--nodes", str(args.nodes)]
        # The build first, outside the profile (a new source is compiled once), by a
        # small run of `small`.
        warm = subprocess.run([BOOTSEER, "sim", "small", "--json", "--out",
                               str(Path(tmp) / "warm")], capture_output=True, text=True)
        if warm.returncode != 0:
            raise SystemExit(f"sim_perf: a run of `small` failed:\n{warm.stderr[-2000:]}")
        run = subprocess.run(["perf", "record", "-q", "-F", str(args.hz), "-e", "cpu-clock",
                              "--call-graph", "dwarf,16384", "-o", str(data), "--", *command],
                             capture_output=True, text=True)
        if run.returncode != 0:
            raise SystemExit(f"sim_perf: the run failed:\n{run.stderr[-2000:]}")
        summary = json.loads(run.stdout.strip().splitlines()[-1])
        total, in_loop, inclusive, own = shares(data)
    if not in_loop:
        raise SystemExit(f"sim_perf: none of {total} samples unwound to {LOOP}: perf cannot "
                         "unwind through this interpreter (see this script's docstring)")
    print(f"{total} samples, {in_loop} in the event loop; shares of those:")
    print(f"{'incl %':>7} {'own %':>6}  function")
    top = own.most_common(args.top)
    for name, _ in inclusive.most_common(args.top):
        print(f"{100 * inclusive[name] / in_loop:7.1f} {100 * own[name] / in_loop:6.1f}  {name}")
    print(json.dumps({
        "bench": "sim_perf", "scenario": args.scenario, "nodes": summary["nodes"],
        "wall_seconds": summary["wall_seconds"], "samples": total, "in_loop": in_loop,
        "own_pct": {n: round(100 * c / in_loop, 2) for n, c in top},
        "inclusive_pct": {n: round(100 * c / in_loop, 2)
                          for n, c in inclusive.most_common(args.top)},
    }))


if __name__ == "__main__":
    main()
