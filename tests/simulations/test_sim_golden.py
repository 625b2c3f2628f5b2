"""The figures of two small runs, pinned: speed work must not change what a run computes.

The simulator's cores are rewritten for speed now and then (fewer objects, other data
structures, draws made without ordering), always with the promise that every result is
unchanged. Comparing two engines (test_sim_compiled.py) cannot see a change made to the
source both are built from; these figures can. They were recorded at d563e90 (stop 43)
and hold since. A change of model changes them: say so in its commit, with the new
figures and why.
"""

from __future__ import annotations

import pytest

from simulations import report
from simulations.scenario import load, override
from simulations.simulation import Simulation

PINNED = {
    # launch: three contents, prefetch and relays; scale: one 64-chunk content
    ("launch", 120): {"p50": 3.6525016039845726, "p99": 6.953643578850643,
                      "max": 7.134436614345067, "swarm_calls": 91191, "events": 56425,
                      "same_rack_bytes": 254208376832, "cross_rack_bytes": 752961454080,
                      "wasted_bytes": 28655484928.0, "origin_bytes": 23622320128},
    ("scale", 300): {"p50": 2.102580121521278, "p99": 3.3642188792562115,
                     "max": 3.4996233853685643, "swarm_calls": 128423, "events": 67753,
                     "same_rack_bytes": 343396057088, "cross_rack_bytes": 940799164416,
                     "wasted_bytes": 30802968576.0, "origin_bytes": 4294967296},
}


@pytest.mark.parametrize("name,nodes", sorted(PINNED))
def test_a_small_run_gives_its_pinned_figures(name: str, nodes: int) -> None:
    sim = Simulation(override(load(name), nodes=nodes))
    stop = sim.run()
    summary = report.collect(sim, stop, 0.0).summary
    assert stop == "complete"
    assert {key: summary[key] for key in PINNED[name, nodes]} == PINNED[name, nodes]
