"""The simulator end to end, on small seeded scenarios: invariants and determinism."""

from __future__ import annotations

import tomllib

import pytest

from p2p.swarm import SwarmConfig
from simulations import report
from simulations.node import RELAYING
from simulations.scenario import Scenario, override, parse
from simulations.simulation import Simulation

BASE = """
[run]
nodes = 24
seed = 3
strategy = "rack_aware"
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

[[workload.content]]
name = "image"
size = "256MiB"
chunk_size = "16MiB"
origin = "registry"
hot_fraction = 0.25
"""


def scenario(extra: str = "", text: str = BASE, **changes: object) -> Scenario:
    return override(parse(tomllib.loads(text + extra), "test.toml", "test"), **changes)


def run(s: Scenario) -> tuple[Simulation, str, dict[str, object]]:
    sim = Simulation(s)
    stop = sim.run()
    return sim, stop, report.collect(sim, stop, 0.0).summary


@pytest.mark.parametrize("strategy",
                         ["origin_only", "random_peers", "rack_aware", "rack_aware_prefetch"])
def test_every_live_node_completes_and_bytes_balance(strategy: str) -> None:
    sim, stop, s = run(scenario(strategy=strategy))
    assert stop == "complete"
    assert all(node.complete_s is not None and node.ready_s is not None for node in sim.nodes)
    assert s["uploaded_bytes"] == s["same_rack_bytes"] + s["cross_rack_bytes"]  # type: ignore[operator]
    # Started at once, no node can beat the fluid floor; the last one cannot either.
    _, _, at_once = run(scenario("\n", text=BASE.replace('start_jitter = "500ms"',
                                                          'start_jitter = "0s"'),
                                 strategy=strategy))
    assert 0 < at_once["floor_seconds"] <= at_once["max"]  # type: ignore[operator]
    assert s["origin_egress_bytes"] >= s["unique_bytes"]  # type: ignore[operator]
    wanted = sum(sim.contents[c].size for node in sim.nodes for c in node.needs)
    received = s["same_rack_bytes"] + s["cross_rack_bytes"] + s["origin_bytes"]  # type: ignore[operator]
    assert received >= wanted


def test_origin_only_pulls_one_copy_per_node_and_peers_pull_about_one() -> None:
    _, _, baseline = run(scenario(strategy="origin_only"))
    _, _, swarm = run(scenario(strategy="rack_aware"))
    assert baseline["origin_egress_ratio"] == pytest.approx(24.0)
    assert swarm["origin_egress_ratio"] < 2.0  # type: ignore[operator]
    assert swarm["p99"] < baseline["p99"]  # type: ignore[operator]


def test_same_seed_same_result_and_another_seed_differs() -> None:
    keys = ("p50", "p99", "max", "origin_egress_bytes", "cross_rack_bytes", "events")
    _, _, a = run(scenario())
    _, _, b = run(scenario())
    _, _, c = run(scenario(seed=4))
    assert [a[k] for k in keys] == [b[k] for k in keys]
    assert [a[k] for k in keys] != [c[k] for k in keys]


def test_prefetch_makes_nodes_ready_before_they_complete() -> None:
    sim, stop, _ = run(scenario(strategy="rack_aware_prefetch"))
    assert stop == "complete"
    early = [n for n in sim.nodes if n.ready_s is not None and n.complete_s is not None
             and n.ready_s < n.complete_s]
    assert len(early) > len(sim.nodes) // 2


def test_nodes_that_fail_mid_launch_do_not_stop_the_others() -> None:
    churn = '\nfail_fraction = 0.25\nfail_window_start = "100ms"\nfail_window_end = "1s"\n'
    text = BASE.replace('start_jitter = "500ms"\n', 'start_jitter = "500ms"' + churn)
    sim, stop, s = run(scenario(text=text))
    assert stop == "complete"
    scheduled = [n for n in sim.nodes if n.fail_s is not None]
    assert len(scheduled) == 6  # a quarter of 24
    # a node that completed before its failure time is not a failure
    assert s["failed_nodes"] == sum(1 for n in scheduled
                                    if n.complete_s is None or n.complete_s > n.fail_s)
    assert s["failed_nodes"] >= 1
    for node in sim.nodes:
        if node.fail_s is None:
            assert node.complete_s is not None
        elif node.complete_s is None:
            assert not node.alive
    assert s["uploaded_bytes"] == s["same_rack_bytes"] + s["cross_rack_bytes"]  # type: ignore[operator]


def test_launch_with_sharded_checkpoint_completes() -> None:
    extra = """
[[workload.content]]
name = "ckpt"
size = "64MiB"
chunk_size = "16MiB"
origin = "registry"
shards = 4
"""
    sim, stop, s = run(scenario(extra))
    assert stop == "complete"
    assert len(sim.contents) == 5
    assert s["unique_bytes"] == 256 * 2**20 + 4 * 64 * 2**20
    assert {sim.contents[node.needs[1]].id for node in sim.nodes[:4]} == {
        "ckpt.0", "ckpt.1", "ckpt.2", "ckpt.3"}


@pytest.mark.parametrize("relaying", [False, True])
def test_all_sources_dead_stops_and_says_so(relaying: bool) -> None:
    text = BASE.replace('latency = "2ms"', 'latency = "2ms"\ndown_at = "0s"')
    sim, stop, s = run(scenario(f"\n[swarm]\nrelay_fetching = {str(relaying).lower()}\n",
                                text=text))
    assert stop.startswith("cannot finish: 24 live nodes still lack chunks")
    assert "origins down: registry" in stop
    assert s["ready_nodes"] == 0
    assert sim.loop.now < 60.0
    # Relay marks promise nothing with every source down (p2p.swarm: 28.6 M swarm calls
    # before marks went with their requests, 11 k with relay_fetching off).
    assert s["swarm_calls"] < 200_000  # type: ignore[operator]


def test_a_node_never_sends_more_pieces_at_once_than_its_upload_slots() -> None:
    sim = Simulation(scenario("\n[agent]\nupload_slots = 2\n"))
    start = sim._start_flow
    most = 0

    def counted(transfer, links):  # type: ignore[no-untyped-def]
        nonlocal most
        start(transfer, links)
        if transfer.src >= 0:  # relays stream beside the slots (simulations.node.RELAYING)
            sending = sum(1 for t in sim._by_flow
                          if t is not None and t.src == transfer.src and t.stage != RELAYING)
            most = max(most, sending)
    sim._start_flow = counted  # type: ignore[method-assign]
    assert sim.run() == "complete"
    assert most == 2


def test_a_download_cap_paces_every_node_and_an_upload_cap_slows_the_swarm() -> None:
    cap = 100e6  # bytes per second
    burst = 4 * 2**20
    sim, stop, _ = run(scenario(f'\n[agent]\ndownload_cap = "{cap:.0f}B/s"\n'))
    assert stop == "complete"
    size = 256 * 2**20
    for node in sim.nodes:
        assert node.complete_s is not None
        # the bucket starts full, then grants `cap` bytes a second
        assert node.complete_s - node.start_s >= (size - burst) / cap - 1e-9
    _, _, fast = run(scenario())
    _, _, slow = run(scenario('\n[agent]\nupload_cap = "100MB/s"\n'))
    assert slow["p50"] > fast["p50"]  # type: ignore[operator]


def _per_node(sim: Simulation) -> list[tuple[object, ...]]:
    return [(n.ready_s, n.complete_s, n.counters) for n in sim.nodes]


@pytest.mark.parametrize("strategy, relaying", [("random_peers", False),
                                                ("rack_aware_prefetch", False),
                                                ("rack_aware", True)])
def test_skipping_haves_of_held_chunks_changes_no_result(
        strategy: str, relaying: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    churn = '\nfail_fraction = 0.25\nfail_window_start = "100ms"\nfail_window_end = "1s"\n'
    text = BASE.replace('start_jitter = "500ms"\n', 'start_jitter = "500ms"' + churn)
    s = scenario(f"\n[swarm]\nrelay_fetching = {str(relaying).lower()}\n", text=text,
                 strategy=strategy)
    fast, _, a = run(s)
    monkeypatch.setattr(Simulation, "skip_redundant_haves", False)
    slow, _, b = run(s)
    assert _per_node(fast) == _per_node(slow)
    assert a["swarm_calls"] < b["swarm_calls"]  # type: ignore[operator]


def test_a_run_makes_no_reference_cycles() -> None:
    """Simulation.run switches the cyclic garbage collector off; this is why that is safe."""
    import gc

    sim = Simulation(scenario(strategy="rack_aware_prefetch"))
    gc.collect()
    gc.disable()
    try:
        assert sim.run() == "complete"
        assert gc.collect() == 0
    finally:
        gc.enable()


def test_cancel_on_wire_drops_cancelled_requests_at_the_sender() -> None:
    _, _, before = run(scenario("\n[agent]\ncancel_on_wire = false\n"))
    _, stop, today = run(scenario())
    assert stop == "complete"
    assert 0 < today["wasted_bytes"] < before["wasted_bytes"]  # type: ignore[operator]
    assert today["uploaded_bytes"] == (today["same_rack_bytes"]  # type: ignore[operator]
                                       + today["cross_rack_bytes"])


def test_nodes_announce_as_the_agents_node_core_decides() -> None:
    """The simulator runs p2p.swarm.node.Node: every announce carries the core's `want`
    (none once complete or linked to max_peers), and a content that completes is
    announced at once."""
    sim = Simulation(scenario("[swarm]\nmax_peers = 4\n"))
    seen: list[tuple[bool, int, bool]] = []  # (complete, want, as the core decides it)
    announce = sim.tracker.announce

    def recording(peer, rack, items, now):  # type: ignore[no-untyped-def]
        for content, _, complete, want in items:
            swarm = sim.nodes[sim._index[peer]].swarms[sim._content_index[content]]
            expected = 0 if swarm.complete or swarm.peer_count >= 4 else 30
            seen.append((complete, want, want == expected))
        return announce(peer, rack, items, now)

    sim.tracker.announce = recording  # type: ignore[method-assign]
    assert sim.run() == "complete"
    assert all(agrees for _, _, agrees in seen)
    assert any(want == 0 and not complete for complete, want, _ in seen)  # linked enough
    # Each node's completion is announced, but the last one's: the run ends with it.
    assert sum(complete for complete, _, _ in seen) == len(sim.nodes) - 1


@pytest.mark.parametrize("relays", ["false", "true"])
def test_a_late_piece_of_a_chunk_already_held_counts_as_wasted(relays: str) -> None:
    """As in the agent (`on_piece`): a request that timed out went elsewhere; when its
    piece still comes, every byte of it is counted as wasted, so that every byte a node
    received beyond the content is in `wasted_bytes`. A request that timed out before
    it went out never goes, and its download budget comes back: no node ends owing
    more than its full pipeline (before that, budgets ran hundreds of MB into debt,
    and with relay_fetching on the run stalled)."""
    sim, stop, _ = run(scenario('\n[agent]\nupload_cap = "400Mbps"\ndownload_cap = "400Mbps"\n'
                                f'\n[swarm]\nrequest_timeout = "1s"\nrelay_fetching = {relays}\n'))
    assert stop == "complete"
    timeouts = sum(sw.stats["timeouts"] for node in sim.nodes for sw in node.swarms.values())
    assert timeouts > 0  # the scenario has what it tests
    for node in sim.nodes:
        c = node.counters
        received = c.down_same_rack + c.down_cross_rack + c.down_origin
        needed = sum(sim.contents[i].size for i in node.needs)
        assert received - needed <= c.wasted_down + 1e-6, node.index
        pipeline = SwarmConfig().max_inflight * sim.contents[0].chunk_bytes(0)
        assert node.download is not None
        assert node.download.available(sim.loop.now) >= -pipeline, node.index


def test_a_relay_is_sent_once_its_sender_has_the_chunk_from_the_origin() -> None:
    """The model's relays are the late bound of the agent's (simulations.node.RELAYING):
    asked for while the sender fetches, their bytes move once the fetch has ended."""
    sim = Simulation(scenario())
    fetched: dict[tuple[int, int, int], float] = {}
    relays: list[tuple[tuple[int, int, int], float]] = []
    start, arrived = sim._start_flow, sim._arrived

    def starting(transfer, links):  # type: ignore[no-untyped-def]
        if transfer.stage == RELAYING:
            relays.append(((transfer.src, transfer.content, transfer.chunk), sim.loop.now))
        start(transfer, links)

    def landed(transfer):  # type: ignore[no-untyped-def]
        if transfer.src < 0:
            fetched[transfer.dst, transfer.content, transfer.chunk] = sim.loop.now
        arrived(transfer)
    sim._start_flow = starting  # type: ignore[method-assign]
    sim._arrived = landed  # type: ignore[method-assign]
    assert sim.run() == "complete"
    assert relays
    assert all(key in fetched and fetched[key] <= t for key, t in relays)


def test_a_cut_through_relay_lands_no_sooner_than_its_senders_own_copy() -> None:
    """`relay_fetching`: a chunk a node still fetches from a peer is relayed on; in the
    model (simulations.node.TAILING) its last byte waits for the sender's copy."""
    sim = Simulation(scenario("\n[swarm]\nrelay_fetching = true\n"))
    first: dict[tuple[int, int, int], float] = {}
    cut: list[tuple[tuple[int, int, int], float]] = []
    arrived = sim._arrived

    def landed(transfer):  # type: ignore[no-untyped-def]
        first.setdefault((transfer.dst, transfer.content, transfer.chunk), sim.loop.now)
        if transfer.cut:
            cut.append(((transfer.src, transfer.content, transfer.chunk), sim.loop.now))
        arrived(transfer)
    sim._arrived = landed  # type: ignore[method-assign]
    assert sim.run() == "complete"
    assert len(cut) >= 5
    assert all(key in first and first[key] <= t for key, t in cut)


def test_earliest_due_serves_the_first_starters_before_each_new_arrival() -> None:
    """Nodes starting over 3 s: neediest first keeps serving the newest arrival, and
    the first starters finish last; earliest due serves whoever is furthest behind its
    line rate (p2p.swarm.uploads)."""
    text = (BASE.replace('start_jitter = "500ms"', 'start_jitter = "3s"')
            .replace("nodes = 24", "nodes = 120").replace("hot_fraction = 0.25\n", ""))
    results = {}
    for order in ("neediest_first", "earliest_due"):
        sim, stop, summary = run(scenario(f'\n[agent]\nupload_order = "{order}"\n', text=text))
        assert stop == "complete"
        first = sorted(sim.nodes, key=lambda n: n.start_s)[:12]
        slowest_first = max(n.complete_s - n.start_s for n in first)  # type: ignore[operator]
        results[order] = (summary["p99"], slowest_first)
    (p99_needy, first_needy), (p99_due, first_due) = results.values()
    assert p99_due < 0.7 * p99_needy  # type: ignore[operator]
    assert first_due < 0.7 * first_needy
