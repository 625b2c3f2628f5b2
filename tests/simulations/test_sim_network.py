"""The fluid network model: fair shares, exact completion times, queueing at origins."""

from __future__ import annotations

import numpy as np
import pytest

from simulations.engine import Loop
from simulations.network import Flows, NetworkSpec, OriginSpec, Topology, fair_rates

GB = 1e9


def test_equal_share_on_one_link() -> None:
    links = np.array([[0, 0, 0], [9, 9, 9], [9, 9, 9], [9, 9, 9]])
    cap = np.array([3.0] + [1e30] * 9)
    assert fair_rates(links, cap).tolist() == pytest.approx([1.0, 1.0, 1.0])


def test_capacity_a_flow_cannot_use_goes_to_the_others() -> None:
    # Link 0 (cap 10) carries flows a and b; a is held to 2 by link 1.
    links = np.array([[0, 0], [1, 3], [3, 3], [3, 3]])
    cap = np.array([10.0, 2.0, 1e30, 1e30])
    assert fair_rates(links, cap).tolist() == pytest.approx([2.0, 8.0])


def test_three_tier_chain_reaches_max_min() -> None:
    # uplink 0 (cap 6) shared by a, b, c; b also on link 1 (cap 1); c on link 2 (cap 2).
    links = np.array([[0, 0, 0], [3, 1, 2], [3, 3, 3], [3, 3, 3]])
    cap = np.array([6.0, 1.0, 2.0, 1e30])
    rates = fair_rates(links, cap)
    assert rates.tolist() == pytest.approx([3.0, 1.0, 2.0])


def test_rates_never_exceed_a_link() -> None:
    rng = np.random.default_rng(5)
    links = rng.integers(0, 20, size=(4, 500))
    cap = rng.uniform(1e6, 1e8, size=20)
    rates = fair_rates(links, cap)
    load = np.zeros(20)
    for row in links:
        np.add.at(load, row, rates)
    # a flow crossing one link twice counts twice here, as in the model
    assert (load <= cap * (1 + 1e-6)).all()


def spec(**origin: object) -> NetworkSpec:
    o = OriginSpec("o", egress_Bps=1 * GB, max_concurrent=1, latency_s=0.0, **origin)  # type: ignore[arg-type]
    return NetworkSpec(racks=2, nic_up_Bps=2 * GB, nic_down_Bps=2 * GB, oversubscription=1.0,
                       same_rack_latency_s=0.0, cross_rack_latency_s=0.0, rate_update_s=0.01,
                       origins=(o,))


def test_a_lone_flow_ends_at_size_over_capacity() -> None:
    loop, done = Loop(), []
    top = Topology(spec(), nodes=4)
    flows = Flows(top, loop)
    flows.start(top.peer_links(0, 1), 1 * GB, 0.0, lambda f: done.append(loop.now))
    loop.run()
    assert done == [pytest.approx(0.5)]


def test_two_flows_into_one_nic_share_it_and_the_survivor_speeds_up() -> None:
    loop, done = Loop(), {}
    top = Topology(spec(), nodes=4)
    flows = Flows(top, loop)
    flows.start(top.peer_links(0, 1), 1 * GB, 0.0, lambda f: done.setdefault("a", loop.now))
    flows.start(top.peer_links(2, 1), 2 * GB, 0.0, lambda f: done.setdefault("b", loop.now))
    loop.run()
    # both at 1 GB/s until a ends at 1.0 s; then b alone at 2 GB/s: 1 GB left, 0.5 s
    assert done["a"] == pytest.approx(1.0, abs=0.011)
    assert done["b"] == pytest.approx(1.5, abs=0.011)


def test_flows_keep_their_progress_when_the_flow_table_grows() -> None:
    """More flows than the table's first size (1,024): the arrays holding each flow's
    state are copied into bigger ones mid-run, and every flow still ends when the fluid
    model says: two flows into node 1 share its NIC (1 GB/s each), and 1,500 more, from
    0.1 s on, each on a pair of nodes of its own, run at a NIC's 2 GB/s."""
    loop, done = Loop(), {}
    top = Topology(spec(), nodes=3004)
    flows = Flows(top, loop)
    flows.start(top.peer_links(0, 1), 1 * GB, 0.0, lambda f: done.setdefault("a", loop.now))
    flows.start(top.peer_links(2, 1), 2 * GB, 0.0, lambda f: done.setdefault("b", loop.now))

    def crowd(_: object) -> None:
        for i in range(1500):
            flows.start(top.peer_links(4 + 2 * i, 5 + 2 * i), 0.2 * GB, loop.now,
                        lambda f, i=i: done.setdefault(i, loop.now))
    loop.at(0.1, crowd)
    loop.run()
    assert done["a"] == pytest.approx(1.0, abs=0.011)
    assert done["b"] == pytest.approx(1.5, abs=0.011)
    assert [done[i] for i in range(1500)] == [pytest.approx(0.2, abs=0.011)] * 1500

def test_cancel_reports_the_bytes_moved() -> None:
    loop = Loop()
    top = Topology(spec(), nodes=4)
    flows = Flows(top, loop)
    f = flows.start(top.peer_links(0, 1), 1 * GB, 0.0, lambda f: pytest.fail("cancelled"))
    moved: list[float] = []
    loop.at(0.25, lambda _: moved.append(flows.cancel(f, loop.now)))
    loop.run()
    assert moved == [pytest.approx(0.5 * GB)]
    assert flows.active == 0


def capped(burst: float) -> tuple[Loop, Topology, Flows]:
    """Node 0 uploads through a 0.1 GB/s cap with a `burst` bucket; its NIC does 2 GB/s."""
    loop = Loop()
    top = Topology(spec(), nodes=4, upload_cap_Bps=0.1 * GB, upload_burst_bytes=int(burst))
    return loop, top, Flows(top, loop)


def test_a_capped_uploader_sends_its_burst_at_nic_speed_then_the_cap() -> None:
    loop, top, flows = capped(0.1 * GB)
    done: list[float] = []
    flows.start(top.peer_links(0, 1), 1.1 * GB, 0.0, lambda f: done.append(loop.now))
    loop.run()
    # 0.1 GB of burst at up to 2 GB/s, then 1 GB at 0.1 GB/s: 10 s (11 s without the burst)
    assert done == [pytest.approx(10.0, abs=0.1)]


def test_the_burst_comes_back_only_after_idling() -> None:
    loop, top, flows = capped(0.1 * GB)
    done: dict[str, float] = {}

    def start(name: str, after: str | None = None) -> None:
        flows.start(top.peer_links(0, 1 + len(done) % 3), 0.1 * GB, loop.now,
                    lambda f: (done.setdefault(name, loop.now),
                               after and loop.at(loop.now, lambda _: start(after), 0)))

    start("first", "right_after")
    loop.at(5.0, lambda _: start("rested"), 0)
    loop.run()
    assert done["first"] < 0.1  # the full bucket
    # then the cap: what the bucket refilled while the first went out, and 1 s for the rest
    assert done["right_after"] == pytest.approx(1.0, abs=0.02)
    assert done["rested"] - 5.0 < 0.1  # refilled while idle


def test_without_a_burst_a_capped_uploader_is_a_slower_nic() -> None:
    loop, top, flows = capped(0)
    done: list[float] = []
    flows.start(top.peer_links(0, 1), 1 * GB, 0.0, lambda f: done.append(loop.now))
    loop.run()
    assert done == [pytest.approx(10.0, abs=0.011)]
