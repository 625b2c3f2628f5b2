"""Before and after, side by side: `bootseer bench swarm` at two git revisions.

Exports each revision's tree (`git archive`) into a temporary directory and
runs `bootseer bench swarm ... --json` from it, with PYTHONPATH pointing at
that tree so the bench and every agent, tracker and origin it starts run that
revision's code. After one uncounted warm-up run of each side, rounds
alternate in ABBA order (before, after, after, before, ...) so both see the
same machine load and neither always goes first, and one JSON line gives each side's figures, their
medians and the median ratio after/before. The figure compared is
`aggregate_mbps` (uncapped runs: higher is better) or `seconds_over_bound`
(capped runs: lower is better); the line says which.

    python benchmarks/ab.py --before REV [--after REV] [--rounds 3] -- \
        --nodes 8 --size 256MiB [--node-cap 50 --origin-cap 50] [--digest blake3]

What a byte costs is compared too: the agents' CPU seconds per GiB delivered
(`agent_cpu_s_per_gib`, computed from `agent_cpu_seconds` for revisions whose
bench did not print it yet), with its medians and `cpu_per_gib_after_over_before`,
and the user part of it (`agent_user_cpu_s_per_gib`, where the bench prints it).
CPU seconds of each whole run are measured too (`cpu_after_over_before`):
unlike wall-clock rates they barely move when other work shares the machine,
so they are the figure to trust for a cost such as re-verification on a busy
machine. `--after` defaults to HEAD. Arguments after `--` go to `bootseer bench swarm`
on both sides; `--before-args` / `--after-args` add arguments to one side
only, so one revision can be compared with itself under two settings, e.g.
`--before HEAD --after-args "--digest blake3"`. A revision with native parts
(setup.py) has them built in its exported tree first; the environment passes on, so
BOOTSEER_BYTEPATH=python measures both sides without the C byte path.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shlex
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
GiB = 1 << 30


def export(rev: str, into: Path) -> Path:
    """The tree of `rev`, unpacked into the new directory `into`."""
    tree = into
    tree.mkdir()
    archive = subprocess.run(["git", "-C", str(REPO), "archive", "--format=tar", rev],
                             check=True, capture_output=True).stdout
    tar_path = into.with_suffix(".tar")
    tar_path.write_bytes(archive)
    with tarfile.open(tar_path) as tar:
        tar.extractall(tree, filter="data")
    if (tree / "setup.py").exists():  # a revision with a native part: build it in the tree
        subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=tree,
                       check=True, capture_output=True)
    return tree


def commit_of(rev: str) -> str:
    """The commit `rev` names now: the JSON line says which code ran, even if the
    revision was a name like HEAD that moves on afterwards."""
    return subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", f"{rev}^{{commit}}"],
                          check=True, capture_output=True, text=True).stdout.strip()


def bench(tree: Path, bench_args: list[str]) -> dict[str, Any]:
    """One `bootseer bench swarm --json` run of the code in `tree` (no baseline round),
    with `cpu_seconds`: user + system CPU of the whole run (bench, tracker, origin and
    agents are all waited-for descendants, so the kernel adds them to ours)."""
    exe = Path(sys.executable).parent / "bootseer"
    env = {**os.environ, "PYTHONPATH": str(tree)}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run([str(exe), "bench", "swarm", *bench_args, "--json",
                           "--no-baseline"], cwd=tree, env=env, capture_output=True,
                          text=True, timeout=1800)
    if done.returncode != 0:
        raise SystemExit(f"bench at {tree.name} failed ({done.returncode}):\n"
                         f"{done.stderr[-2000:]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    result["cpu_seconds"] = round(after.ru_utime + after.ru_stime
                                  - before.ru_utime - before.ru_stime, 2)
    result.setdefault("agent_cpu_s_per_gib", round(
        result["agent_cpu_seconds"] / (result["nodes"] * result["bytes"] / GiB), 3))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", required=True, help="git revision measured as 'before'")
    parser.add_argument("--after", default="HEAD", help="git revision measured as 'after'")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--before-args", default="", help="extra bench arguments, before only")
    parser.add_argument("--after-args", default="", help="extra bench arguments, after only")
    parser.add_argument("bench_args", nargs=argparse.REMAINDER,
                        help="-- then arguments for `bootseer bench swarm`")
    args = parser.parse_args()
    bench_args = [a for a in args.bench_args if a != "--"]
    capped = "--node-cap" in bench_args or "--origin-cap" in bench_args
    figure = "seconds_over_bound" if capped else "aggregate_mbps"
    commits = {"before": commit_of(args.before), "after": commit_of(args.after)}
    with tempfile.TemporaryDirectory(prefix="bootseer-ab-") as tmp:
        trees = {side: export(rev, Path(tmp) / side) for side, rev in commits.items()}
        extra = {"before": shlex.split(args.before_args), "after": shlex.split(args.after_args)}
        runs: dict[str, list[dict[str, Any]]] = {"before": [], "after": []}
        for side, tree in trees.items():  # warm-up, not counted: the first runs are slow
            bench(tree, bench_args + extra[side])
        for i in range(args.rounds):
            # ABBA order: neither side always runs first in a round
            for side in (("before", "after") if i % 2 == 0 else ("after", "before")):
                runs[side].append(bench(trees[side], bench_args + extra[side]))
                print(f"{side}: {runs[side][-1][figure]}, "
                      f"{runs[side][-1]['agent_cpu_s_per_gib']} CPU-s/GiB", file=sys.stderr)
    medians = {side: statistics.median(r[figure] for r in rs) for side, rs in runs.items()}
    cpu = {side: statistics.median(r["cpu_seconds"] for r in rs) for side, rs in runs.items()}
    per_gib = {side: statistics.median(r["agent_cpu_s_per_gib"] for r in rs)
               for side, rs in runs.items()}
    print(json.dumps({
        "bench": "ab", "before": args.before, "after": args.after,
        "before_commit": commits["before"], "after_commit": commits["after"], "args": bench_args,
        "before_args": args.before_args, "after_args": args.after_args,
        "figure": figure, "rounds": args.rounds,
        "before_values": [r[figure] for r in runs["before"]],
        "after_values": [r[figure] for r in runs["after"]],
        "before_median": medians["before"], "after_median": medians["after"],
        "after_over_before": round(medians["after"] / medians["before"], 3),
        "before_cpu_s_per_gib": [r["agent_cpu_s_per_gib"] for r in runs["before"]],
        "after_cpu_s_per_gib": [r["agent_cpu_s_per_gib"] for r in runs["after"]],
        "before_cpu_s_per_gib_median": per_gib["before"],
        "after_cpu_s_per_gib_median": per_gib["after"],
        "cpu_per_gib_after_over_before": round(per_gib["after"] / per_gib["before"], 3),
        # ... of which user CPU (the interpreter): revisions before it was printed say None
        "before_user_cpu_s_per_gib": [r.get("agent_user_cpu_s_per_gib") for r in runs["before"]],
        "after_user_cpu_s_per_gib": [r.get("agent_user_cpu_s_per_gib") for r in runs["after"]],
        "before_cpu_seconds": [r["cpu_seconds"] for r in runs["before"]],
        "after_cpu_seconds": [r["cpu_seconds"] for r in runs["after"]],
        "cpu_after_over_before": round(cpu["after"] / cpu["before"], 3),
        "after_rss_mb": max(r["max_agent_rss_mb"] for r in runs["after"]),
        "load_average": round(os.getloadavg()[0], 2),
    }))


if __name__ == "__main__":
    main()
