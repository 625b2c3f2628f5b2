"""Batched announces against the real tracker: one request per node for all its contents."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest
import test_tracker_service as service
from test_tracker_service import C, Tracker, signed

from p2p.content import ContentId, PeerId
from p2p.tracker_client import ContentState, TrackerClient

tracker, client, http = service.tracker, service.client, service.http  # the fixtures

D = ContentId("c1-" + "2" * 64)
E = ContentId("c1-" + "3" * 64)


async def node(client: TrackerClient, peer: str, *states: ContentState) -> dict[ContentId, Any]:
    return await client.announce_all(PeerId(peer), f"127.0.0.1:{7000 + len(peer)}", "r0",
                                     list(states))


async def peers_of(http: aiohttp.ClientSession, tracker: Tracker) -> int:
    async with http.get(tracker.url + "/healthz") as r:
        return int((await r.json())["peers"])


async def test_one_request_announces_every_content_and_hands_out_only_where_wanted(
        client: TrackerClient) -> None:
    for p in ["a", "b", "c"]:
        await node(client, p, ContentState(C, 0, False, want=0), ContentState(D, 0, False,
                                                                              want=0))
    replies = await node(client, "d", ContentState(C, 1, False, want=0),
                         ContentState(D, 1, False))
    assert replies[C].peers == []
    assert sorted(p.peer for p in replies[D].peers) == ["a", "b", "c"]
    assert [replies[c].origin_slot for c in (C, D)] == [3, 3]  # the fourth incomplete member
    assert replies[C].interval == replies[D].interval > 0


async def test_stopped_leaves_only_that_content(client: TrackerClient) -> None:
    await node(client, "a", ContentState(C, 0, False), ContentState(D, 0, False))
    await node(client, "a", ContentState(C, 0, False, event="stopped"),
               ContentState(D, 0, False))
    replies = await node(client, "b", ContentState(C, 0, False), ContentState(D, 0, False))
    assert replies[C].peers == []
    assert [p.peer for p in replies[D].peers] == ["a"]


NODE = {"peer": "p", "addr": "127.0.0.1:7000", "rack": "r"}


def body(**contents: Any) -> bytes:
    return json.dumps({**NODE, "contents": contents}).encode()


@pytest.mark.parametrize("raw, message", [
    (json.dumps(NODE).encode(), 'missing field "contents"'),
    (json.dumps({**NODE, "contents": []}).encode(), 'field "contents" must be dict'),
    (body(**{"nope": {}}), "field \"contents\": key 'nope'"),
    (body(**{C: 3}), f'field "contents.{C}" must be an object'),
    (body(**{C: {"have": 1, "complete": False}, D: {"have": "1", "complete": False}}),
     f'field "contents.{D}.have" must be int'),
    (body(**{C: {"have": 1}}), f'missing field "contents.{C}.complete"'),
    (body(**{C: {"have": 1, "complete": False, "want": -1}}), f'field "contents.{C}.want"'),
    (body(**{C: {"have": 1, "complete": False, "event": "paused"}}),
     f'field "contents.{C}.event"'),
    (body(**{f"c1-{i:064x}": {"have": 0, "complete": False} for i in range(257)}),
     "at most 256 per announce"),
])
async def test_malformed_batched_announce_is_a_400_naming_the_field_and_changes_nothing(
        tracker: Tracker, http: aiohttp.ClientSession, raw: bytes, message: str) -> None:
    status, reply = await signed(http, tracker, "POST", "/v1/announce", raw)
    assert status == 400
    assert message in reply["error"]
    assert await peers_of(http, tracker) == 0


async def test_the_single_content_form_still_works(tracker: Tracker,
                                                   http: aiohttp.ClientSession) -> None:
    """What an agent of the previous release sends, during a rolling upgrade."""
    for peer in ["a", "b"]:
        one = {"content": C, "peer": peer, "addr": f"127.0.0.1:{7000 + ord(peer)}",
               "rack": "r", "have": 0, "complete": False}
        status, reply = await signed(http, tracker, "POST", "/v1/announce",
                                     json.dumps(one).encode())
        assert status == 200
    assert [p["peer"] for p in reply["peers"]] == ["a"]
    assert reply["origin_slot"] == 1 and reply["interval"] > 0
    assert "contents" not in reply
