"""The pause a reader sees when the mount server's host is killed under its mount.

A random content of `--bytes` is put into a chunk store (every chunk local, no
agent), a tree maps one file to it, and a mount server (`bootseer fs server`)
serves it through its host with no-open (every READ through the host, none by
passthrough: the reads that need the host are the ones that pause). Each round,
on a fresh mount: a reader (another process) opens the file and reads 1 MiB at
its start, then waits; the host is killed (SIGKILL); the reader then reads
1 MiB at the file's end (far from what read-ahead brought in), which waits
until the server's new host serves the mount again. `pause_seconds`: from the
kill to that read's end; `read_seconds`: the same read through a live host
(the file's middle), for scale. The bytes read are checked.

    python benchmarks/mount_restart.py [--bytes N] [--rounds N]

One JSON line; medians of the rounds, each round's figures too.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

from fuse_read import make_store

from fusefs.bench.mountserver import MountServer
from fusefs.mount import LOG_DIR_ENV
from fusefs.tree import Entry, Extent, Kind, Layer, build_tree
from p2p.content import CHUNK_SIZE
from p2p.units import MiB

# Reads 1 MiB at `offset` of the file on each line of stdin; prints when each read ended
# (time.monotonic) and whether its bytes were the expected ones.
READER = """
import hashlib, os, sys, time
fd = os.open(sys.argv[1], os.O_RDONLY)
for line in sys.stdin:
    offset, digest = line.split()
    data = os.pread(fd, 1 << 20, int(offset))
    print(time.monotonic(), hashlib.sha256(data).hexdigest() == digest, flush=True)
"""


async def one_round(work: Path, server: MountServer, store: Path, data_of: dict[int, str],
                    size: int, i: int) -> dict[str, float | bool]:
    where = work / f"mnt{i}"
    where.mkdir()
    argv = [sys.executable, "-m", "fusefs", "mount", str(work / "tree.json"), str(where),
            "--api-socket", str(work / "no-agent.sock"), "--store-dir", str(store),
            "--no-open"]
    env = {**os.environ, LOG_DIR_ENV: str(work)}
    ready = await server.mount(argv, work / f"mount{i}.log", env)
    reader = await asyncio.create_subprocess_exec(
        sys.executable, "-c", READER, str(where / "f"), stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE)
    assert reader.stdin is not None and reader.stdout is not None

    async def read(offset: int) -> tuple[float, bool]:
        assert reader.stdin is not None and reader.stdout is not None
        reader.stdin.write(f"{offset} {data_of[offset]}\n".encode())
        ended, ok = (await reader.stdout.readline()).split()
        return float(ended), ok == b"True"

    try:
        await read(0)
        began = time.monotonic()
        ended, ok_live = await read(size // 2)
        live = ended - began
        killed = time.monotonic()
        os.kill(int(ready["server_pid"]), signal.SIGKILL)
        ended, ok_after = await read(size - MiB)
    finally:
        reader.stdin.close()
        await reader.wait()
        await server.unmount(ready)
    return {"pause_seconds": round(ended - killed, 3), "read_seconds": round(live, 4),
            "ok": ok_live and ok_after}


async def run(args: argparse.Namespace, work: Path) -> dict[str, object]:
    store = work / "store"
    manifest = await asyncio.to_thread(make_store, store, args.bytes)
    tree = build_tree([Layer("bench", [Entry("f", Kind.FILE, size=manifest.size, extents=(
        Extent(manifest.content_id, 0, manifest.size),))])])
    (work / "tree.json").write_bytes(tree.to_json())
    data_of = {o: _digest(store / manifest.content_id, o)
               for o in (0, manifest.size // 2, manifest.size - MiB)}
    server = await MountServer.start(work / "server.sock", work / "server.log", dict(os.environ))
    rounds = []
    try:
        for i in range(args.rounds):
            rounds.append(await one_round(work, server, store, data_of, manifest.size, i))
    finally:
        await server.stop()
    return {"bench": "mount_restart", "bytes": args.bytes, "rounds": rounds,
            "pause_seconds": statistics.median(r["pause_seconds"] for r in rounds),
            "read_seconds": statistics.median(r["read_seconds"] for r in rounds),
            "verified": all(r["ok"] for r in rounds), "load": os.getloadavg()}


def _digest(chunks: Path, offset: int) -> str:
    """SHA-256 of the content's 1 MiB at `offset`, from its chunk file (one chunk holds it:
    the offsets are 1 MiB-aligned and chunks are 4 MiB)."""
    with open(chunks / f"{offset // CHUNK_SIZE}.chunk", "rb") as f:
        f.seek(offset % CHUNK_SIZE)
        return hashlib.sha256(f.read(MiB)).hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bytes", type=int, default=256 * MiB)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", default=None, help="work directory (default: a temp dir)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="mount-restart-") as work:
        print(json.dumps(asyncio.run(run(args, Path(work)))), flush=True)


if __name__ == "__main__":
    main()
