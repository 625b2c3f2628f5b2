"""Run in a fresh process on a compiled build (`python -P sim_loop_child.py SCENARIO NODES`,
the build first on PYTHONPATH): the CPU and wall time of `Simulation.run` alone, and what
identifies the run. One child for `sim_alt.py` (revisions) and `sim_alloc.py` (allocators).

The huge-page arenas are installed first where the build has them (simulations.hugearena;
an older revision's tree has no such module), and the line then says how much of the
process sat on huge pages after the run.
"""

import json
import sys
import time
from pathlib import Path

try:
    from simulations import hugearena
except ImportError:  # a revision from before the arenas
    hugearena = None  # type: ignore[assignment]
installed = hugearena.install() if hugearena is not None else False

from simulations import compiled  # noqa: E402  (after the arenas, as the child of `bootseer sim`)
from simulations.scenario import load, override  # noqa: E402
from simulations.simulation import Simulation  # noqa: E402

assert compiled.active(), "not the compiled build"
sim = Simulation(override(load(sys.argv[1]), nodes=int(sys.argv[2])))
cpu, wall = time.thread_time(), time.perf_counter()
stop = sim.run()
cpu, wall = time.thread_time() - cpu, time.perf_counter() - wall
line = {"run_cpu_seconds": round(cpu, 3), "run_wall_seconds": round(wall, 3),
        "arenas_installed": installed,
        "same": [stop, sim.events_delivered, sim.ready, sim.loop.now]}
if hugearena is not None:
    ours, total = hugearena.huge_page_bytes()
    rss = max(int(f.split()[1]) for f in Path("/proc/self/status").read_text().splitlines()
              if f.startswith("VmHWM"))
    line |= {"arena_huge_mb": ours >> 20, "huge_mb": total >> 20, "peak_rss_mb": rss >> 10}
print(json.dumps(line))
