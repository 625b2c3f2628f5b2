"""Two ways a received chunk can reach its file, side by side: what each costs in CPU.

- `write`: the bytes are in a reused 4 MiB buffer (where `recv_into` puts them); hash
  it, then write(2) it into a new file in 256 KiB slices (what `p2p.store` does).
- `mmap`: map a new, fallocated file and put the bytes straight into its pages (what
  `recv_into` a mapping of the chunk file would do), then hash the mapping.

Both fill the same amount of new page cache; the copy from a hot source buffer stands
in for the socket. Rounds alternate (write, mmap, mmap, write, ...) because the first
pages a process gets may be ones the host has to fault in again (free page
reporting), which costs several times the copy. One JSON line: CPU seconds per GiB of
each way, every round, and the median ratio mmap / write.

    python benchmarks/write_paths.py [--mib 512] [--rounds 2] [--dir DIR]
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import resource
import shutil
import statistics
import tempfile
from pathlib import Path

import xxhash

CHUNK = 4 << 20
SLICE = 256 << 10
MADV_POPULATE_WRITE = 23  # Linux 5.14+: fault the whole mapping in with one call


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def by_write(path: str, src: memoryview, buf: memoryview) -> None:
    buf[:] = src  # the socket's copy into the reused buffer
    xxhash.xxh3_128_digest(buf)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        pos = 0
        while pos < CHUNK:
            pos += os.write(fd, buf[pos:pos + SLICE])
    finally:
        os.close(fd)


def by_mmap(path: str, src: memoryview, _buf: memoryview) -> None:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.posix_fallocate(fd, 0, CHUNK)  # else a full disk is a SIGBUS, not an error
        with mmap.mmap(fd, CHUNK) as mapped:
            mapped.madvise(MADV_POPULATE_WRITE)
            view = memoryview(mapped)
            view[:] = src  # the socket's copy, straight into the file's pages
            xxhash.xxh3_128_digest(view)
            view.release()
    finally:
        os.close(fd)


WAYS = {"write": by_write, "mmap": by_mmap}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=int, default=512, help="MiB of new files per round")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of each way")
    parser.add_argument("--dir", type=Path, default=None, help="where (default: a temp dir)")
    args = parser.parse_args()
    src = memoryview(bytearray(os.urandom(CHUNK)))
    buf = memoryview(bytearray(CHUNK))
    chunks = max(1, args.mib * (1 << 20) // CHUNK)
    costs: dict[str, list[float]] = {name: [] for name in WAYS}
    root = Path(tempfile.mkdtemp(prefix="bootseer-write-paths-", dir=args.dir))
    try:
        order = [("write", "mmap") if i % 2 == 0 else ("mmap", "write")
                 for i in range(args.rounds)]
        for n, name in enumerate(name for pair in order for name in pair):
            before = _cpu()
            for i in range(chunks):
                WAYS[name](str(root / f"{n}-{i}"), src, buf)
            costs[name].append(round((_cpu() - before) / (chunks * CHUNK / (1 << 30)), 3))
    finally:
        shutil.rmtree(root)
    medians = {name: statistics.median(values) for name, values in costs.items()}
    print(json.dumps({"bench": "write_paths", "mib_per_round": chunks * CHUNK >> 20,
                      "cpu_s_per_gib": costs,
                      "mmap_over_write": round(medians["mmap"] / medians["write"], 2)}))


if __name__ == "__main__":
    main()
