"""Build an index for one gzip layer and time reads through `LayerReader`; one JSON line.

    tar -C / -cf - usr/lib/python3.11 usr/lib/python3 usr/share/perl usr/share/perl5 \\
        usr/lib/postgresql | gzip -6 > /tmp/usr.tar.gz
    python benchmarks/gzindex_bench.py /tmp/usr.tar.gz

Figures: index build rate (compressed and tar MB/s, wall and CPU), index size
against the blob, cold 4 KiB reads (each in a span not decoded yet), the same
reads warm (from the span cache), and sequential 1 MiB reads of the whole tar.
Two shared cores: compare figures from one run, not across machines.
"""

from __future__ import annotations

import hashlib
import json
import random
import sys
import time
from pathlib import Path

import msgpack

from fusefs.image.gzindex import build_index
from fusefs.image.layerreader import LayerReader

MB = 1e6
READ_BYTES = 4096
SEQUENTIAL_BYTES = 1 << 20


def timed(work):  # type: ignore[no-untyped-def]
    wall, cpu = time.perf_counter(), time.process_time()
    result = work()
    return result, time.perf_counter() - wall, time.process_time() - cpu


def main(path: Path) -> dict[str, object]:
    digest = "sha256:" + hashlib.file_digest(path.open("rb"), "sha256").hexdigest()
    blob_bytes = path.stat().st_size
    with path.open("rb") as blob:
        index, wall, cpu = timed(lambda: build_index(blob, digest))
    data = index.to_bytes()
    toc_bytes = len(msgpack.packb(msgpack.unpackb(data)["toc"]))
    rng = random.Random(1)
    spans = rng.sample(range(len(index.spans)), min(40, len(index.spans)))  # fit the cache
    offsets = [rng.randrange(index.spans[s].tar_offset, index.span_end(s) - READ_BYTES)
               for s in spans]
    with LayerReader(index, path.open) as reader:
        _, cold, _ = timed(lambda: [reader.read(o, READ_BYTES) for o in offsets])
        _, warm, _ = timed(lambda: [reader.read(o, READ_BYTES) for o in offsets])
    with LayerReader(index, path.open) as reader:
        _, seq, _ = timed(lambda: [reader.read(o, SEQUENTIAL_BYTES)
                                   for o in range(0, index.tar_bytes, SEQUENTIAL_BYTES)])
    return {"blob_MB": round(blob_bytes / MB, 1), "tar_MB": round(index.tar_bytes / MB, 1),
            "members": len(index.members), "spans": len(index.spans),
            "build_blob_MB_per_s": round(blob_bytes / MB / wall),
            "build_tar_MB_per_s": round(index.tar_bytes / MB / wall),
            "build_cpu_s": round(cpu, 2),
            "index_KB": round(len(data) / 1e3), "zran_KB": round(len(index.zran) / 1e3),
            "toc_KB": round(toc_bytes / 1e3),
            "index_pct_of_blob": round(100 * len(data) / blob_bytes, 2),
            "cold_4KiB_read_ms": round(1e3 * cold / len(offsets), 2),
            "warm_4KiB_read_ms": round(1e3 * warm / len(offsets), 3),
            "sequential_1MiB_tar_MB_per_s": round(index.tar_bytes / MB / seq)}


if __name__ == "__main__":
    print(json.dumps(main(Path(sys.argv[1]))))
