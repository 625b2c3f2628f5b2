"""Sequential read throughput through the fusefs mount, by path, against the store's files.

One random content of `--bytes` (1 GiB by default, 4 MiB chunks) is written
into a chunk store, so every chunk is local; a tree maps `--rounds` files to
that whole content (distinct inodes, so each first read through the mount
misses the kernel's page cache of the mount and really goes through FUSE), and
one more, `second`, read after the first on the same mount: for passthrough, a
file whose whole file this process has already verified (`*_second_*`).
The mount is served by `python -m fusefs mount` in a child process, as in
production; no agent runs (a local chunk never goes through it).

First the content's whole file (`fusefs.backing`: the layout passthrough needs,
one contiguous file written from verified chunks) is built, timed, in this
process. Then each round, side by side, on fresh mounts: a read of the store's
chunk files directly (4 MiB `readinto` per file), `dd bs=4M` of one file through
a pyfuse3 mount (`--no-passthrough`: the handler path, today's baseline), and
the same through the kernel-protocol mount (passthrough: the kernel reads the
whole file; its first open hashes the whole file once, as every new serving
process does), and through a kernel-protocol mount before the whole file exists
(`unbuilt_*`: every chunk local, as after `ckpt prefetch`, the first read a job
makes). All read from the page cache, so the ratios are the cost of the
FUSE paths. Medians are printed as one JSON line (GB/s = 1e9 bytes per second)
with each path's serving-process CPU seconds per GiB, the path that really
served (the server's own account: passthrough means no READ reached it), and
the re-read rate of a file already read. dd's own rate leaves out the open, where
a passthrough mount checks the whole file the first time: `*_with_open_gbps`
counts it (the dd process from start to end, as `bench ckpt` and `bench image`
time it).

A fresh mount per round: within one mount, the third GiB of page cache kept
for it made the server's system time grow about six-fold here (not
diagnosed; unmounting frees it).

    python benchmarks/fuse_read.py [--bytes N] [--rounds N] [--read-ahead-kb N] [--dir DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from fusefs.backing import WholeFiles
from fusefs.bench.readpath import read_path
from fusefs.mount import Mount
from fusefs.tree import Entry, Extent, Kind, Layer, build_tree
from p2p.content import CHUNK_SIZE, Manifest, ManifestBuilder
from p2p.store import ChunkStore
from p2p.units import GiB


def make_store(store_dir: Path, size: int) -> Manifest:
    """A random content of `size` bytes, every chunk put into a store at `store_dir`."""
    builder = ManifestBuilder(CHUNK_SIZE)
    chunks = []
    for offset in range(0, size, CHUNK_SIZE):
        chunk = os.urandom(min(CHUNK_SIZE, size - offset))
        builder.feed(chunk)
        chunks.append(chunk)
    manifest = builder.finish("blob", "file:///nowhere")
    store = ChunkStore(store_dir, size + GiB)
    store.attach(manifest)
    for index, chunk in enumerate(chunks):
        store.put(manifest.content_id, index, chunk)
    return manifest


def dd_gbps(path: Path) -> float:
    out = subprocess.run(["dd", f"if={path}", "of=/dev/null", "bs=4M"], capture_output=True,
                         text=True, check=True).stderr
    match = re.search(r"^(\d+) bytes .* copied, ([\d.]+) s", out, re.MULTILINE)
    assert match, out
    return int(match[1]) / float(match[2]) / 1e9


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a live process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def direct_gbps(store_dir: Path, manifest: Manifest) -> float:
    buf = bytearray(CHUNK_SIZE)
    total = 0
    began = time.perf_counter()
    for index in range(manifest.chunks):
        with open(store_dir / manifest.content_id / f"{index}.chunk", "rb", buffering=0) as f:
            total += f.readinto(buf) or 0
    return total / (time.perf_counter() - began) / 1e9


async def one_read(work: Path, store_dir: Path, name: str, size: int, read_ahead_kb: int,
                   *extra: str) -> dict[str, object]:
    """`dd` of `name` through a fresh mount: GB/s, server CPU s/GiB, path, re-read GB/s."""
    log = work / f"mount-{name}-{'-'.join(extra) or 'default'}.log"
    async with await Mount.start(work / "tree.json", work / "mnt", str(work / "no-agent.sock"),
                                 store_dir, log, "--read-ahead-kb", str(read_ahead_kb),
                                 *extra) as mount:
        before = cpu_seconds(mount.proc.pid)
        began = time.perf_counter()
        gbps = await asyncio.to_thread(dd_gbps, mount.mountpoint / name)
        wall = size / (time.perf_counter() - began) / 1e9  # with the open, which dd leaves out
        cpu = (cpu_seconds(mount.proc.pid) - before) * GiB / size
        reread = await asyncio.to_thread(dd_gbps, mount.mountpoint / name)
        before = cpu_seconds(mount.proc.pid)  # another file of the content, in this process
        second = await asyncio.to_thread(dd_gbps, mount.mountpoint / "second")
        second_cpu = (cpu_seconds(mount.proc.pid) - before) * GiB / size
        ready = mount.ready
    return {"gbps": gbps, "wall": wall, "cpu": cpu, "reread": reread, "second": second,
            "second_cpu": second_cpu, "path": read_path(log),
            "read_ahead_kb": ready.get("read_ahead_kb")}


def build_whole(store_dir: Path, manifest: Manifest) -> tuple[float, float]:
    """Seconds and CPU seconds per GiB to write the content's whole file from its chunks."""
    began, cpu = time.perf_counter(), time.process_time()
    assert WholeFiles(store_dir).build(manifest), "the whole file could not be built"
    seconds = time.perf_counter() - began
    return seconds, (time.process_time() - cpu) * GiB / manifest.size


async def run(args: argparse.Namespace, work: Path) -> dict[str, object]:
    store_dir = work / "store"
    manifest = await asyncio.to_thread(make_store, store_dir, args.bytes)
    extent = (Extent(manifest.content_id, 0, manifest.size),)
    names = [*(f"file{i}" for i in range(args.rounds)), "second"]
    tree = build_tree([Layer("bench", [Entry(name, Kind.FILE, size=manifest.size,
                                             extents=extent) for name in names])])
    (work / "tree.json").write_bytes(tree.to_json())
    (work / "mnt").mkdir()
    build_s, build_cpu = await asyncio.to_thread(build_whole, store_dir, manifest)
    direct: list[float] = []
    runs: dict[str, list[dict[str, object]]] = {"handler": [], "passthrough": [],
                                                "unbuilt": []}
    await asyncio.to_thread(direct_gbps, store_dir, manifest)  # warm the page cache
    whole = WholeFiles(store_dir).path(manifest.content_id)
    for i in range(args.rounds):
        direct.append(await asyncio.to_thread(direct_gbps, store_dir, manifest))
        for mode, extra in (("handler", ("--no-passthrough",)), ("passthrough", ())):
            runs[mode].append(await one_read(work, store_dir, f"file{i}", manifest.size,
                                             args.read_ahead_kb, *extra))
        # The first read after a prefetch: every chunk local, no backing file yet.
        whole.unlink()
        runs["unbuilt"].append(await one_read(work, store_dir, f"file{i}", manifest.size,
                                              args.read_ahead_kb))
        if not whole.exists():  # this revision built none: the next round needs it
            await asyncio.to_thread(build_whole, store_dir, manifest)
    d = statistics.median(direct)
    out: dict[str, object] = {"bytes": args.bytes, "rounds": args.rounds,
                              "direct_read_gbps": round(d, 3)}
    for mode, results in runs.items():
        key = {"passthrough": "", "handler": "handler_", "unbuilt": "unbuilt_"}[mode]

        def med(field: str, rs: list[dict[str, object]] = results) -> float:
            return statistics.median(float(r[field]) for r in rs)  # type: ignore[arg-type]
        out |= {f"{key}fuse_read_gbps": round(med("gbps"), 3),
                f"{key}fuse_read_with_open_gbps": round(med("wall"), 3),
                f"{key}server_cpu_s_per_gib": round(med("cpu"), 3),
                f"{key}fuse_reread_gbps": round(med("reread"), 3),
                f"{key}second_read_gbps": round(med("second"), 3),
                f"{key}second_server_cpu_s_per_gib": round(med("second_cpu"), 3),
                f"{key}read_path": sorted({str(r["path"]) for r in results}),
                f"{key}fuse_runs_gbps": [round(float(r["gbps"]), 3) for r in results]}  # type: ignore[arg-type]
    out["read_ahead_kb"] = runs["handler"][-1]["read_ahead_kb"]
    out["passthrough_over_handler"] = round(float(out["fuse_read_gbps"]) /  # type: ignore[arg-type]
                                            float(out["handler_fuse_read_gbps"]), 2)  # type: ignore[arg-type]
    out["unbuilt_over_built_with_open"] = round(
        float(out["unbuilt_fuse_read_with_open_gbps"]) /  # type: ignore[arg-type]
        float(out["fuse_read_with_open_gbps"]), 3)  # type: ignore[arg-type]
    out["fuse_to_direct"] = round(float(out["fuse_read_gbps"]) / d, 3)  # type: ignore[arg-type]
    out["whole_build_seconds"] = round(build_s, 3)
    out["whole_build_cpu_s_per_gib"] = round(build_cpu, 3)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bytes", type=int, default=GiB)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--read-ahead-kb", dest="read_ahead_kb", type=int, default=4096)
    parser.add_argument("--dir", default=None, help="work directory (default: a temp dir)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="fuse-read-") as work:
        print(json.dumps(asyncio.run(run(args, Path(work)))), flush=True)


if __name__ == "__main__":
    main()
