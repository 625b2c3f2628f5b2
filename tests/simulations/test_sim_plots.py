"""The simulator's plots explain themselves: what the title names, what the floor is
labelled as, why a CDF ends where it does, and a flat series drawn flat."""

from __future__ import annotations

from typing import Any

from matplotlib import pyplot as plt

from simulations import scenario
from simulations.report import Result, caption, figures
from simulations.simulation import Simulation
from simulations.sweep.data import title
from simulations.sweep.plan import Axis
from simulations.sweep.run import run_point


def result(**summary: Any) -> Result:
    base = {"scenario": "s", "strategy": "rack_aware", "nodes": 10, "ready_nodes": 10,
            "failed_nodes": 0, "floor_seconds": 2.0, "floor_by": "origin", "makespan_s": 2.8,
            "same_rack_bytes": 1, "cross_rack_bytes": 1, "origin_bytes": 1, "wasted_bytes": 0}
    ready = summary.get("ready_nodes", base["ready_nodes"])
    return Result({**base, **summary},
                  {"startup_s": [1.0 + i * 0.2 for i in range(ready)] + [None] * (10 - ready),
                   "node": list(range(10))},
                  [(n, 1.0) for n in range(1, 11)], "1 GiB in 1 content(s); NIC 25 Gbit/s")


def test_titles_name_the_size_and_links_and_the_floor_says_what_it_bounds() -> None:
    figs = figures(result())
    try:
        for fig in figs.values():
            assert "1 GiB in 1 content(s); NIC 25 Gbit/s" in fig.axes[0].get_title()
        labels = [t.get_text() for t in figs["completion_cdf"].axes[0].get_legend().get_texts()]
        assert any("the last node, no sooner" in label for label in labels), labels
        assert not figs["completion_cdf"].texts  # nothing to explain: no note
    finally:
        plt.close("all")


def test_a_cdf_that_ends_early_or_short_says_why() -> None:
    figs = figures(result(ready_nodes=8, failed_nodes=2, makespan_s=9.0))
    try:
        cdf = figs["completion_cdf"]
        (line,) = cdf.axes[0].get_lines()[:1]
        assert max(line.get_ydata()) == 0.8  # of all nodes: the failed two never count
        (note,) = cdf.texts
        assert "2 node(s) never became ready (2 failed)" in note.get_text()
        assert "makespan (9 s) counts from the first node's start" in note.get_text()
    finally:
        plt.close("all")


def test_a_flat_egress_series_is_drawn_from_zero() -> None:
    figs = figures(result())
    try:
        low, high = figs["origin_egress"].axes[0].get_ylim()
        assert low == 0 and high >= 1.0  # not 0.96..1.04 around the constant 1.0
    finally:
        plt.close("all")


def test_the_caption_comes_from_the_scenario() -> None:
    sim = Simulation(scenario.override(scenario.load("small"), nodes=4))
    text = caption(sim)
    spec = sim.scenario.network
    assert f"NIC {spec.nic_down_Bps * 8 / 1e9:.3g} Gbit/s down" in text
    assert text.startswith(f"{sum(c.size for c in sim.contents) / 2**30:.3g} GiB")


def test_a_sweep_plot_title_says_what_was_run() -> None:
    small = scenario.override(scenario.load("small"), nodes=4)
    summary, _ = run_point(small)
    assert summary["caption"] == caption(Simulation(small))
    description = {"scenario": "small", "seeds": [1, 2]}
    rows = [{"caption": summary["caption"]}, {"caption": summary["caption"]}]
    axis = Axis("network.racks", (2, 4), None)
    text = title(description, rows, "p99", axis)
    assert text == f"small: p99 by racks (2 seeds)\n{summary['caption']}"
    varied = title(description, [*rows, {"caption": "1 GiB in 1 content(s)"}], "p99", axis)
    assert varied.endswith("(varies by run)")
    assert title(description, [{}], "p99", axis) == "small: p99 by racks (2 seeds)"
