"""Where the agents' CPU goes in one `bootseer bench swarm` round, from `perf`.

Runs `bootseer bench swarm ... --no-baseline --json --workdir DIR` and, once the
round's agents have started, `perf record` on every agent process (the seed's
too with `--nodes 1`) until the bench ends. One JSON line gives the bench's own
figures, the share of the agents' samples that is the page cache being filled
(`page_fill_share`: `copy_folio_from_iter_atomic` under write(2) and the page
clearing of first touches, which on a VM whose free memory the host takes back
is mostly the host's fault handling: benchmarks/RESULTS.md, issue 31), the share
in the kernel and in the interpreter, and the agents' CPU per GiB without the page
fill (`agent_cpu_s_per_gib_beside_fill`): what changes to the agents can move.

    python benchmarks/agent_perf.py [--top 15] -- --nodes 1 --size 1GiB

Needs `perf` (linux-perf) and a kernel that lets this user profile its processes.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PAGE_FILL = ("copy_folio_from_iter_atomic", "clear_page_erms", "clear_page_rep",
             "clear_page_orig")
INTERPRETER = re.compile(r"^_?Py|^_Py|^PyObject|^PyEval|^gc_|^unicode|^tuple|^dict|^list_")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--top", type=int, default=15, help="symbols to list")
    parser.add_argument("--freq", type=int, default=499, help="samples per second")
    parser.add_argument("bench_args", nargs=argparse.REMAINDER,
                        help="-- then `bootseer bench swarm` arguments")
    args = parser.parse_args()
    if shutil.which("perf") is None:
        parser.error("perf is not installed (apt-get install linux-perf)")
    bench_args = [a for a in args.bench_args if a != "--"]
    with tempfile.TemporaryDirectory(prefix="agent-perf-") as tmp:
        work = Path(tmp) / "w"
        bench = subprocess.Popen(
            [sys.executable, "-m", "p2p", "bench", "swarm", *bench_args, "--no-baseline",
             "--json", "--workdir", str(work)], cwd=REPO, stdout=subprocess.PIPE, text=True)
        pids = _round_agents(work, bench)
        data = Path(tmp) / "perf.data"
        perf = subprocess.Popen(["perf", "record", "-F", str(args.freq), "-o", str(data),
                                 "-p", ",".join(map(str, pids))],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        out, _ = bench.communicate()
        perf.send_signal(2)  # SIGINT: perf writes its file and exits
        perf.wait(timeout=60)
        result = json.loads(out.strip().splitlines()[-1])
        shares = _symbols(data)
    total = sum(shares.values()) or 1.0
    fill = sum(v for k, v in shares.items() if k.split()[-1] in PAGE_FILL) / total
    kernel = sum(v for k, v in shares.items() if k.startswith("[k]")) / total
    interp = sum(v for k, v in shares.items()
                 if k.startswith("[.]") and INTERPRETER.search(k.split()[-1])) / total
    cpu = result["agent_cpu_s_per_gib"]
    print(json.dumps({
        "bench": "agent_perf", "args": bench_args,
        **{k: result[k] for k in ("nodes", "seconds", "aggregate_mbps", "agent_cpu_s_per_gib",
                                  "agent_user_cpu_s_per_gib", "write_floor_cpu_s_per_gib",
                                  "agent_cores", "max_agent_rss_mb", "verified")},
        "page_fill_share": round(fill, 3), "kernel_share": round(kernel, 3),
        "interpreter_share": round(interp, 3),
        "agent_cpu_s_per_gib_beside_fill": round(cpu * (1 - fill), 3),
        "top": [[k, round(v / total, 3)] for k, v in
                sorted(shares.items(), key=lambda kv: -kv[1])[:args.top]],
    }))
    return 0 if result["verified"] else 1


def _round_agents(work: Path, bench: subprocess.Popen[str]) -> list[int]:
    """The pids of the round's agents (and the seed's), once the first has started."""
    pattern = f"{work}/(seed|swarm[0-9]+)/agent.toml"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and bench.poll() is None:
        found = subprocess.run(["pgrep", "-f", f"{work}/swarm0/agent.toml"],
                               capture_output=True, text=True).stdout.split()
        if found:
            time.sleep(0.3)  # the others start beside it
            return [int(p) for p in subprocess.run(["pgrep", "-f", pattern], capture_output=True,
                                                   text=True).stdout.split()]
        time.sleep(0.05)
    raise SystemExit("agent_perf: the bench's agents never started")


def _symbols(data: Path) -> dict[str, float]:
    """Sample share by symbol ("[k] name" or "[.] name"), from `perf report`."""
    text = subprocess.run(["perf", "report", "-i", str(data), "--no-children", "--sort", "sym",
                           "-q", "-g", "none"], capture_output=True, text=True).stdout
    shares: dict[str, float] = collections.defaultdict(float)
    for line in text.splitlines():
        match = re.match(r"\s*([\d.]+)%\s+(\[[.k]\])\s+(\S+)", line)
        if match:
            shares[f"{match[2]} {match[3]}"] += float(match[1])
    return shares


if __name__ == "__main__":
    sys.exit(main())
