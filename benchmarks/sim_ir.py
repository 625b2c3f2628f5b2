"""Several revisions of the simulator by instructions executed: a count, not a time.

    python benchmarks/sim_ir.py REV [REV ...] [--scenario launch] [--nodes 200]

On a shared machine with no hardware counters (this one: `perf stat` says
"not supported"), CPU seconds move by 10-25% between runs minutes apart, and a
change worth 3% cannot be seen in fewer than a dozen rounds. Valgrind's
cachegrind counts the instructions a process executes, within 0.05% from one
run of a build to the next. Each revision's tree is exported and built as
`sim_alt.py` does, then `sim_loop_child.py` runs once per revision under
cachegrind (about 40x slower than natively: keep `--nodes` small) on CPython's
own allocator (what the arena module changes is where memory lies, not the
count), with a fixed hash seed. Prints one JSON line per revision and a last
one with each revision's instructions and their ratio to the first's.

The count covers the whole process: the imports and the scenario's setup are
about 1.2 G instructions, the same for every revision that does not change
them. It counts work, not memory stalls: a change that makes fewer instructions
but touches more memory can still be slower at 10,000 nodes, which only
`sim_alt.py` and a whole run show.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from ab import export  # benchmarks/ab.py
from sim_alt import CHILD, build


def instructions(built: Path, scenario: str, nodes: int, out: Path) -> tuple[int, object]:
    # (a fixed hash seed: str hashes move dict layouts, and with them about 0.5% of the count)
    env = {**os.environ, "PYTHONPATH": str(built), "PYTHONMALLOC": "pymalloc",
           "PYTHONHASHSEED": "0"}
    done = subprocess.run(["valgrind", "--tool=cachegrind", "--cache-sim=no",
                           f"--cachegrind-out-file={out}", sys.executable, "-P", CHILD,
                           scenario, str(nodes)],
                          env=env, capture_output=True, text=True, cwd=built)
    if done.returncode != 0:
        raise SystemExit(f"run on {built} failed:\n{done.stderr[-2000:]}")
    refs = re.search(r"I\s+refs:\s+([\d,]+)", done.stderr)
    if refs is None:
        raise SystemExit(f"cachegrind printed no count:\n{done.stderr[-2000:]}")
    same = json.loads(done.stdout.strip().splitlines()[-1])["same"]
    return int(refs.group(1).replace(",", "")), same


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("revs", nargs="+", help="git revisions")
    parser.add_argument("--scenario", default="launch")
    parser.add_argument("--nodes", type=int, default=200)
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        raise SystemExit("sim_ir needs valgrind (Debian: apt-get install valgrind)")
    counts: dict[str, int] = {}
    sames: list[object] = []
    with tempfile.TemporaryDirectory(prefix="bootseer-sim-ir-") as tmp:
        for i, rev in enumerate(args.revs):
            built = build(export(rev, Path(tmp) / f"tree{i}"), Path(tmp) / f"cache{i}")
            counts[rev], same = instructions(built, args.scenario, args.nodes,
                                             Path(tmp) / f"cg{i}.out")
            sames.append(same)
            print(json.dumps({"rev": rev, "instructions": counts[rev], "same": same}),
                  flush=True)
    first = counts[args.revs[0]]
    print(json.dumps({
        "bench": "sim_ir", "scenario": args.scenario, "nodes": args.nodes,
        "instructions": counts,
        "over_first": {rev: round(n / first, 4) for rev, n in counts.items()},
        "same_run": len({json.dumps(s) for s in sames}) == 1,
    }))


if __name__ == "__main__":
    main()
