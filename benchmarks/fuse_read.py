"""Sequential read throughput through the fusefs mount against the store's own files.

One random content of `--bytes` (1 GiB by default, 4 MiB chunks) is written
into a chunk store, so every chunk is local; a tree maps `--rounds` files to
that whole content (distinct inodes, so each first read through the mount
misses the kernel's page cache of the mount and really goes through FUSE).
The mount is served by `python -m fusefs mount` in a child process, as in
production; no agent runs (a local chunk never goes through it).

Each round, side by side: `dd bs=4M` of one file through a fresh mount (the
first read of that file: the FUSE process opens, checks the hash of, and preads
every chunk file), and a read of the same store files directly (4 MiB
`readinto` per chunk file). Both read from the page cache of the store's
files, so the ratio is the cost of the FUSE path. Medians are printed as one
JSON line (GB/s = 1e9 bytes per second) with the read_ahead_kb in effect, the
re-read rate of a file already read (kernel page cache, keep_cache), and the
FUSE server's CPU seconds per GiB of first reads, which moves much less than
the rates when other work shares the machine.

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


async def run(args: argparse.Namespace, work: Path) -> dict[str, object]:
    store_dir = work / "store"
    manifest = await asyncio.to_thread(make_store, store_dir, args.bytes)
    extent = (Extent(manifest.content_id, 0, manifest.size),)
    tree = build_tree([Layer("bench", [Entry(f"file{i}", Kind.FILE, size=manifest.size,
                                             extents=extent) for i in range(args.rounds)])])
    (work / "tree.json").write_bytes(tree.to_json())
    (work / "mnt").mkdir()
    fuse, direct, reread, cpu = [], [], [], []
    read_ahead = None
    await asyncio.to_thread(direct_gbps, store_dir, manifest)  # warm the page cache
    for i in range(args.rounds):
        direct.append(await asyncio.to_thread(direct_gbps, store_dir, manifest))
        async with await Mount.start(work / "tree.json", work / "mnt",
                                     str(work / "no-agent.sock"), store_dir,
                                     work / "mount.log", "--read-ahead-kb",
                                     str(args.read_ahead_kb)) as mount:
            before = cpu_seconds(mount.proc.pid)
            fuse.append(await asyncio.to_thread(dd_gbps, mount.mountpoint / f"file{i}"))
            cpu.append((cpu_seconds(mount.proc.pid) - before) * GiB / manifest.size)
            reread.append(await asyncio.to_thread(dd_gbps, mount.mountpoint / f"file{i}"))
            read_ahead = mount.read_ahead_kb
    f, d = statistics.median(fuse), statistics.median(direct)
    return {"bytes": args.bytes, "rounds": args.rounds, "fuse_read_gbps": round(f, 3),
            "direct_read_gbps": round(d, 3), "fuse_to_direct": round(f / d, 3),
            "fuse_reread_gbps": round(statistics.median(reread), 3),
            "server_cpu_s_per_gib": round(statistics.median(cpu), 3),
            "read_ahead_kb": read_ahead, "fuse_runs_gbps": [round(x, 3) for x in fuse]}


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
