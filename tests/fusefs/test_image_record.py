"""Hot-block records: recording, merging, ordering, and refusing bad or foreign records."""

from __future__ import annotations

import json

import pytest

from fusefs.image.record import MAX_RUNS, Record, Recorder, RecordError

IMAGE = "sha256:" + "a" * 64
OTHER = "sha256:" + "b" * 64
L1, L2 = "sha256:" + "1" * 64, "sha256:" + "2" * 64


def test_the_recorder_keeps_first_accesses_within_the_window() -> None:
    rec = Recorder(IMAGE, start=100.0, window_s=10.0)
    rec.touched(L1, [3, 4], now=100.5)
    rec.touched(L1, [4, 5], now=101.0)  # 4 again: its first access stays 0.5
    rec.touched(L2, [0], now=99.0)  # before the start counts as 0
    rec.touched(L2, [9], now=111.0)  # past the window: ignored
    record = rec.record()
    assert record.runs == 1
    assert record.times == {(L1, 3): (0.5,), (L1, 4): (0.5,), (L1, 5): (1.0,), (L2, 0): (0.0,)}
    assert record.order() == [(L2, 0), (L1, 3), (L1, 4), (L1, 5)]
    assert record.by_layer() == {L2: [0], L1: [3, 4, 5]}


def test_merged_records_order_chunks_by_median_first_access() -> None:
    a = Record(IMAGE, 1, {(L1, 0): (5.0,), (L1, 1): (1.0,)})
    b = Record(IMAGE, 1, {(L1, 0): (0.5,), (L1, 2): (3.0,)})
    c = Record(IMAGE, 1, {(L1, 0): (0.7,), (L1, 1): (9.0,)})
    merged = a.merge(b).merge(c)
    assert merged.runs == 3
    # chunk 0: median(5, 0.5, 0.7) = 0.7; chunk 1: median(1, 9) = 5; chunk 2: 3
    assert merged.order() == [(L1, 0), (L1, 2), (L1, 1)]


def test_merging_keeps_a_bounded_history_per_chunk() -> None:
    record = Record(IMAGE, 1, {(L1, 0): (100.0,)})
    for _ in range(MAX_RUNS):
        record = record.merge(Record(IMAGE, 1, {(L1, 0): (1.0,)}))
    assert record.times[(L1, 0)] == (1.0,) * MAX_RUNS and record.runs == MAX_RUNS + 1


def test_a_record_of_another_image_is_never_used() -> None:
    record = Record(OTHER, 1, {(L1, 0): (0.0,)})
    with pytest.raises(RecordError, match="not " + IMAGE):
        record.for_image(IMAGE)
    with pytest.raises(RecordError):
        Record(IMAGE, 1, {}).merge(record)


def test_records_round_trip_and_are_deterministic() -> None:
    record = Record(IMAGE, 2, {(L2, 7): (0.25, 0.5), (L1, 1): (0.1,)})
    data = record.to_bytes()
    assert Record.from_bytes(data) == record
    assert Record.from_bytes(data).to_bytes() == data


@pytest.mark.parametrize("doc", [
    b"not json", b"[]", b'{"version": 2}',
    json.dumps({"version": 1, "image": "sha256:xyz", "runs": 1, "chunks": []}).encode(),
    json.dumps({"version": 1, "image": IMAGE, "runs": -1, "chunks": []}).encode(),
    json.dumps({"version": 1, "image": IMAGE, "runs": 1, "chunks": [[L1, -1, [0.0]]]}).encode(),
    json.dumps({"version": 1, "image": IMAGE, "runs": 1, "chunks": [[L1, 0, []]]}).encode(),
    json.dumps({"version": 1, "image": IMAGE, "runs": 1, "chunks": [["../x", 0, [0]]]}).encode(),
    json.dumps({"version": 1, "image": IMAGE, "runs": 1,
                "chunks": [[L1, 0, [float("1e12")]]]}).encode(),
])
def test_bad_record_files_are_refused(doc: bytes) -> None:
    with pytest.raises(RecordError):
        Record.from_bytes(doc, "test record")
