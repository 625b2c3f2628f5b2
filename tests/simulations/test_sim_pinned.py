"""A fixed seed gives fixed numbers: the simulator's results, pinned.

The speed work on the swarm core and the simulator (issue 37) must not move a
result unless it says which model change moved it. `test_sim.py` checks that
two runs in one process agree; this module checks that a run agrees with the
numbers recorded for it, so a change that alters a decision, a random draw
or the order of events fails here. A deliberate change of model updates
these numbers in the same commit and says why.

Two small scenarios cover the paths a big run takes: rack-aware swarming
with prefetch and cut-through relays, and one with an upload cap (its token
bucket credit), a download cap, and nodes failing midway.
"""

from __future__ import annotations

import hashlib
import tomllib

import pytest

from simulations import report
from simulations.scenario import parse
from simulations.simulation import Simulation

SCENARIO = """
[run]
nodes = 24
seed = 7
strategy = "rack_aware_prefetch"
stall_after = "30s"

[network]
racks = 3
nic_up = "10Gbps"
nic_down = "10Gbps"
oversubscription = 2.0
rate_update = "5ms"

[[origin]]
name = "registry"
egress = "5Gbps"
max_concurrent = 8
latency = "2ms"

[tracker]
origin_fetchers = 2

[workload]
start_jitter = "500ms"
{churn}

[[workload.content]]
name = "image"
size = "256MiB"
chunk_size = "16MiB"
origin = "registry"
hot_fraction = 0.25

[[workload.content]]
name = "deps"
size = "128MiB"
chunk_size = "8MiB"
origin = "registry"
{agent}
"""

CAPPED = ('fail_fraction = 0.25\nfail_window_start = "100ms"\nfail_window_end = "1s"',
          '\n[agent]\nupload_cap = "4Gbps"\ndownload_cap = "8Gbps"\n')

KEYS = ("p50", "p90", "p99", "max", "origin_egress_bytes", "same_rack_bytes",
        "cross_rack_bytes", "wasted_bytes", "failed_nodes")


def summary_and_digest(churn: str, agent: str) -> tuple[dict[str, object], str]:
    text = SCENARIO.format(churn=churn, agent=agent)
    sim = Simulation(parse(tomllib.loads(text), "pinned.toml", "pinned"))
    stop = sim.run()
    assert stop == "complete"
    summary = report.collect(sim, stop, 0.0).summary
    # Every node's times to the nanosecond and its bytes by tier.
    rows = [(n.index, n.ready_s, n.complete_s, n.counters.down_same_rack,
             n.counters.down_cross_rack, n.counters.down_origin, n.counters.up)
            for n in sim.nodes]
    text_rows = repr([(i, None if r is None else round(r, 9), None if c is None else round(c, 9),
                       *rest) for i, r, c, *rest in rows])
    return {k: summary[k] for k in KEYS}, hashlib.sha256(text_rows.encode()).hexdigest()[:16]


@pytest.mark.parametrize(("churn", "agent", "pinned", "digest"), [
    ("", "", {
        "p50": 0.35270850008778315, "p90": 0.49827362764131944, "p99": 0.5625841821944404,
        "max": 0.5625841821944404, "origin_egress_bytes": 402653184.0,
        "same_rack_bytes": 3405774848, "cross_rack_bytes": 5855248384,
        "wasted_bytes": 377487360.0, "failed_nodes": 0,
    }, "44288400116a7bcd"),
    (*CAPPED, {
        "p50": 13.183817202993627, "p90": 13.396549941052998, "p99": 13.443163433899883,
        "max": 13.443163433899883, "origin_egress_bytes": 486539264.0,
        "same_rack_bytes": 2810183680, "cross_rack_bytes": 4487905280,
        "wasted_bytes": 1579431375.1279414, "failed_nodes": 6,
    }, "9e33e26ee161935a"),
], ids=["swarm", "capped-with-failures"])
def test_a_seeded_run_gives_the_pinned_numbers(churn: str, agent: str,
                                               pinned: dict[str, object], digest: str) -> None:
    summary, got = summary_and_digest(churn, agent)
    assert summary == pytest.approx(pinned, rel=1e-12)
    assert got == digest
