"""A checkpoint's first opens after its prefetch: one file after another, or all at once.

    python benchmarks/open_many.py [--files 4] [--bytes 268435456] [--rounds 3]

`bootseer launch` opens every file of a prefetched checkpoint once, so that the
serving process builds each large file's backing file (`fusefs.backing`,
BUILD_AT_OPEN_BYTES) before the job reads it, and the job's first read goes by
passthrough. This measures that bring-up step alone: `--files` contents of
`--bytes` each, every chunk in a local store (as after `ckpt prefetch`), a
tree with one file per content, and a fresh kernel-protocol mount per case
(`python -m fusefs mount`, as in production). Each round removes the backing
files and then opens every file once, either one after another on one thread
(`serial`) or each on a thread of its own (`concurrent`, as
`hdfs_stripe.launch` does it); the two alternate, ABBA. Prints one JSON line:
the seconds of each case, their medians, the serving process's CPU seconds
per GiB, and `concurrent_over_serial` (below 1 is faster).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from fuse_read import cpu_seconds, make_store  # benchmarks/fuse_read.py

from fusefs.backing import WholeFiles
from fusefs.mount import Mount
from fusefs.tree import Entry, Extent, Kind, Layer, build_tree
from hdfs_stripe.launch import open_once
from p2p.units import GiB


def open_all(paths: list[Path], concurrent: bool) -> float:
    """Seconds to open (and close) every path once."""
    began = time.perf_counter()
    if concurrent:
        with ThreadPoolExecutor(max_workers=len(paths)) as pool:
            list(pool.map(open_once, paths))
    else:
        for path in paths:
            open_once(path)
    return time.perf_counter() - began


async def one_case(work: Path, store: Path, names: list[str], concurrent: bool,
                   size: int) -> tuple[float, float]:
    """(seconds, serving CPU seconds per GiB) of opening every file once on a fresh mount."""
    async with await Mount.start(work / "tree.json", work / "mnt", str(work / "no-agent.sock"),
                                 store, work / "mount.log") as mount:
        before = cpu_seconds(mount.proc.pid)
        seconds = await asyncio.to_thread(open_all, [mount.mountpoint / n for n in names],
                                          concurrent)
        cpu = (cpu_seconds(mount.proc.pid) - before) * GiB / size
    return seconds, cpu


async def run(args: argparse.Namespace, work: Path) -> dict[str, object]:
    store = work / "store"
    manifests = [await asyncio.to_thread(make_store, store, args.bytes)
                 for _ in range(args.files)]
    names = [f"shard{i}" for i in range(args.files)]
    tree = build_tree([Layer("bench", [
        Entry(name, Kind.FILE, size=m.size, extents=(Extent(m.content_id, 0, m.size),))
        for name, m in zip(names, manifests, strict=True)])])
    (work / "tree.json").write_bytes(tree.to_json())
    (work / "mnt").mkdir()
    wholes = WholeFiles(store)
    seconds: dict[str, list[float]] = {"serial": [], "concurrent": []}
    cpu: dict[str, list[float]] = {"serial": [], "concurrent": []}
    for i in range(args.rounds):
        order = ("serial", "concurrent") if i % 2 == 0 else ("concurrent", "serial")
        for case in order:
            for m in manifests:  # the first open after a prefetch: no backing file yet
                wholes.path(m.content_id).unlink(missing_ok=True)
            s, c = await one_case(work, store, names, case == "concurrent",
                                  args.files * args.bytes)
            seconds[case].append(round(s, 3))
            cpu[case].append(round(c, 3))
    med = {case: statistics.median(values) for case, values in seconds.items()}
    return {"bench": "open_many", "files": args.files, "bytes_per_file": args.bytes,
            "rounds": args.rounds, "seconds": seconds,
            "median_s": {case: round(v, 3) for case, v in med.items()},
            "server_cpu_s_per_gib": {case: round(statistics.median(v), 3)
                                     for case, v in cpu.items()},
            "concurrent_over_serial": round(med["concurrent"] / med["serial"], 3),
            "load_average": [round(x, 2) for x in os.getloadavg()]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=4)
    parser.add_argument("--bytes", type=int, default=256 << 20)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--dir", default=None, help="work directory (default: a temp dir)")
    args = parser.parse_args()
    if args.files < 1 or args.bytes < 1 or args.rounds < 1:
        parser.error("--files, --bytes and --rounds must be at least 1")
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="open-many-") as work:
        print(json.dumps(asyncio.run(run(args, Path(work)))), flush=True)


if __name__ == "__main__":
    main()
