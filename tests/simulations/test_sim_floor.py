"""The floor: the fluid lower bound a simulated run is judged against."""

from __future__ import annotations

import pytest

from simulations.floor import NeededContent, floor

MB = 1_000_000


def content(size_mb: int, chunks: int, origins: tuple[int, ...] = (0,)) -> NeededContent:
    return NeededContent(tuple([size_mb * MB // chunks] * chunks), origins)


def test_kraken_shape_is_bound_by_each_node_s_download() -> None:
    layers = [content(1500, 90, (0, 1, 2, 3, 4)), content(1500, 90, (0, 1, 2, 3, 4))]
    nodes = 2600
    f = floor(layers, [(0, 1)] * nodes, [i // 40 for i in range(nodes)], down_Bps=300 * MB,
              up_Bps=300 * MB, origin_Bps=[1250 * MB] * 5, oversubscription=1.0)
    assert (f.by, f.seconds) == ("node_download", pytest.approx(10.0))


def test_a_slow_origin_sets_the_floor() -> None:
    f = floor([content(1000, 10, (0, 1))], [(0,)] * 4, [0, 0, 1, 1], down_Bps=100 * MB,
              up_Bps=100 * MB, origin_Bps=[10 * MB, 50 * MB], oversubscription=1.0)
    assert (f.by, f.seconds) == ("origin", pytest.approx(50.0))  # 500 MB from a 10 MB/s one


def test_many_nodes_with_little_upload_are_bound_by_the_total() -> None:
    f = floor([content(100, 10)], [(0,)] * 100, [0] * 100, down_Bps=100 * MB, up_Bps=1 * MB,
              origin_Bps=[100 * MB], oversubscription=1.0)
    assert (f.by, f.seconds) == ("upload", pytest.approx(100 * 100 / 200))


def test_an_oversubscribed_rack_needing_many_shards_is_bound_by_its_uplink() -> None:
    shards = [content(100, 4) for _ in range(8)]  # node i needs shard i % 8
    f = floor(shards, [(i % 8,) for i in range(8)], [0] * 8, down_Bps=100 * MB,
              up_Bps=100 * MB, origin_Bps=[10_000 * MB], oversubscription=8.0)
    assert (f.by, f.seconds) == ("rack_uplink", pytest.approx(800 / 100))


def test_readiness_counts_only_the_chunks_it_needs() -> None:
    hot = NeededContent((MB, 0, 0, MB), (0,))  # a hot set of two chunks of four
    f = floor([hot], [(0,)], [0], down_Bps=MB, up_Bps=MB, origin_Bps=[100 * MB],
              oversubscription=1.0)
    assert f.seconds == pytest.approx(2.0)
