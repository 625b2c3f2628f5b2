"""The simulator's CPU model: processor sharing, per node or shared, and readiness after it."""

from __future__ import annotations

import pytest
from test_sim import run, scenario

from simulations.cpu import CpuPool


def test_jobs_share_the_cores_and_end_in_order_of_their_work() -> None:
    pool = CpuPool(cores=2.0)
    for job, work in (((0, 0), 1.0), ((1, 0), 2.0), ((2, 0), 3.0)):
        pool.add(0.0, job, work)
    # three jobs on two cores: each at 2/3 of a core; the 1 s job ends at 1.5 s
    assert pool.next_end() == pytest.approx(1.5)
    assert pool.finish(1.5) == [(0, 0)]
    # then two jobs, a core each: 2 - 1 = 1 s left and 3 - 1 = 2 s left
    assert pool.next_end() == pytest.approx(2.5)
    assert pool.finish(2.5) == [(1, 0)]
    assert pool.next_end() == pytest.approx(3.5)
    assert pool.finish(3.5) == [(2, 0)] and pool.next_end() is None


def test_a_job_added_later_slows_the_others_from_then_on() -> None:
    pool = CpuPool(cores=1.0)
    pool.add(0.0, (0, 0), 2.0)
    pool.add(1.0, (1, 0), 1.0)  # 1 s of the first is done; now both at half a core
    assert pool.finish(2.9) == []
    assert pool.next_end() == pytest.approx(3.0)
    assert pool.finish(3.0) == [(0, 0), (1, 0)]


CPU = '\ncpu = "2s"\ncpu_origin_only = "6s"\n'


@pytest.mark.parametrize(("strategy", "work"), [("rack_aware_prefetch", 2.0),
                                                ("origin_only", 6.0)])
def test_on_shared_cores_nodes_are_ready_after_all_their_work_is_shared_out(
        strategy: str, work: float) -> None:
    """24 nodes share 2 cores: the last is ready no sooner than 24 x work / 2 after the
    first node starts; with no CPU work it is ready far sooner."""
    shared = scenario(CPU + '\n[cpu]\ncores = 2\nshared = true\n', strategy=strategy)
    sim, stop, summary = run(shared)
    assert stop == "complete" and summary["ready_nodes"] == 24
    last_ready = max(n.ready_s for n in sim.nodes if n.ready_s is not None)
    assert last_ready - min(n.start_s for n in sim.nodes) >= 24 * work / 2
    _, _, plain = run(scenario(strategy=strategy))
    assert plain["max"] < 24 * work / 2
    assert summary["max"] == pytest.approx(plain["max"] + 24 * work / 2, rel=0.5)


def test_own_cores_add_each_nodes_work_once() -> None:
    """A core per node: every node is ready `work` after its bytes, whatever the others do."""
    _, _, plain = run(scenario())
    _, stop, own = run(scenario(CPU))
    assert stop == "complete"
    assert own["max"] == pytest.approx(plain["max"] + 2.0, abs=0.6)


def test_bad_cpu_settings_name_the_key() -> None:
    from simulations.scenario import ScenarioError

    with pytest.raises(ScenarioError, match=r"cpu\.cores"):
        scenario("\n[cpu]\ncores = 0\n")
    with pytest.raises(ScenarioError, match=r"content\[0\]\.cpu"):
        scenario('\ncpu = "fast"\n')
