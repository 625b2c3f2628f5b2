"""What writing a GiB of new page cache costs here: memory the host took back vs memory
just freed.

The agents' CPU per GiB (`bootseer bench swarm`, `agent_cpu_s_per_gib`) counts the
page cache their chunk files fill. On a VM whose balloon reports free pages to
the host (virtio-balloon free page reporting; `/sys/module/page_reporting`), a
page freed a while ago is gone from the guest, and its next first touch faults
into the hypervisor: that is the `copy_folio_from_iter_atomic` share of the
agents' profile (`benchmarks/agent_perf.py`). This bench measures it alone, in
rounds that alternate:

- cold: write 1 GiB (4 MiB pwrites from one reused buffer) into a new file after
  the memory has been free for `--rest` seconds;
- warm: the same right after unlinking the previous file, so the kernel hands
  back pages the host has not taken yet.

    python benchmarks/page_fill.py [--rounds 3] [--rest 10]

One JSON line: CPU seconds (user + system) per GiB of each round, their medians and
the ratio, and the page-reporting settings when the kernel has them.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import tempfile
import time
from pathlib import Path

GiB = 1 << 30
STEP = 4 << 20
REPORTING = Path("/sys/module/page_reporting/parameters")


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def write_gib(path: Path, buf: bytes) -> float:
    """CPU seconds to write 1 GiB of `buf` into a new file at `path`."""
    began = cpu_seconds()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        for off in range(0, GiB, STEP):
            os.pwrite(fd, buf, off)
    finally:
        os.close(fd)
    return cpu_seconds() - began


def reporting() -> dict[str, str] | None:
    if not REPORTING.is_dir():
        return None
    return {p.name: p.read_text().strip() for p in sorted(REPORTING.iterdir())
            if p.name in ("page_reporting_order", "min_free_ms")}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="cold/warm pairs")
    parser.add_argument("--rest", type=float, default=10.0,
                        help="seconds the memory stays free before a cold round")
    parser.add_argument("--dir", default=tempfile.gettempdir(), help="where to write")
    args = parser.parse_args()
    buf = os.urandom(STEP)
    path = Path(args.dir) / f"bootseer-page-fill-{os.getpid()}.bin"
    cold: list[float] = []
    warm: list[float] = []
    try:
        for _ in range(args.rounds):
            time.sleep(args.rest)
            cold.append(round(write_gib(path, buf), 3))
            path.unlink()
            warm.append(round(write_gib(path, buf), 3))
            path.unlink()
    finally:
        path.unlink(missing_ok=True)
    cold_median, warm_median = statistics.median(cold), statistics.median(warm)
    print(json.dumps({
        "bench": "page_fill", "rounds": args.rounds, "rest_s": args.rest,
        "cold_cpu_s_per_gib": cold, "warm_cpu_s_per_gib": warm,
        "cold_median": cold_median, "warm_median": warm_median,
        "cold_over_warm": round(cold_median / warm_median, 2),
        "host_reclaim_cpu_s_per_gib": round(cold_median - warm_median, 3),
        "page_reporting": reporting(), "load_average": round(os.getloadavg()[0], 2)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
