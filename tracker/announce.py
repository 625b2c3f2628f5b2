"""The announce view: one request per node per interval, for all its contents.

    POST /v1/announce
    {"peer": "n17", "addr": "10.1.2.3:7001", "rack": "r4",
     "contents": {"c1-...": {"have": 120, "complete": false, "want": 30},
                  "c1-...": {"have": 0, "complete": false, "event": "stopped"}}}

    -> {"interval": 2.0,
        "contents": {"c1-...": {"peers": [...], "origin_slot": 0, "origin_slots": 4,
                                "origin_filled": 4}, ...}}

A node announces every content it holds or fetches in one request; for each
it says how many chunks it holds (`have`), whether it is `complete`, the
bytes it fetched from the origin so far (`origin_bytes`, optional; the
status page sums them), how many peers it wants (`want`, default the
tracker's handout limit, 0 when it has enough: then no handout is drawn at
all) and an optional `event` ("started", "completed", or "stopped" to
leave that swarm). The reply has an entry per
announced content: its origin slot always, and `peers` drawn only for the
contents that asked. A node announcing the same content twice in a request
is impossible (JSON object keys); at most `MAX_CONTENTS` per request.

The body is checked whole before anything changes: a malformed content is a
400 that names the field (`contents.c1-....have`), and no content of that
request is applied. A checked announce becomes one op (tracker.machine) that
the tracker's core applies, here or through the replicas' shared log. The
per-peer rate limit counts requests, not contents (in the single-content
form: requests per content, as before).

The single-content form (`"content": id` with `have`, `complete`, `want`,
`event` at the top level, and the flat reply) is kept as a batch of one: it
costs nothing, and agents of the previous release keep working during a
rolling upgrade.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from p2p.content import ContentId, PeerId
from tracker import payload
from tracker.guard import BadRequest, Forbidden, source_host
from tracker.machine import Announce, ContentAnnounce
from tracker.state import TRACKER

MAX_HAVE = 2**53
MAX_BYTES = 2**62
MAX_CONTENTS = 256
EVENTS = (None, "started", "completed", "stopped")
UNSPECIFIED_HOSTS = ("0.0.0.0", "::")


async def announce(request: web.Request) -> web.Response:
    t = request.app[TRACKER]
    body = payload.json_object(await t.guard.authenticate(request))
    host = source_host(request)
    peer = PeerId(payload.text(body, "peer"))
    batched = "contents" in body or "content" not in body
    items = _contents(body, t.config.handout_limit) if batched \
        else [_one(body, "", ContentId(""), t.config.handout_limit)]
    key = (host, peer) if batched else (host, peer, items[0].content)
    t.guard.limit(t.guard.announce_rate, key, "announces from this peer")
    t.metrics.announces.inc()
    t.metrics.content_announces.inc(len(items))
    addr, rack = None, ""
    if any(item.event != "stopped" for item in items):
        addr, rack = _addr(body, host)
    results = await t.core.submit(Announce(peer, host, addr, rack, tuple(items)))
    interval = t.config.announce_interval_seconds
    if batched:
        return payload.reply({"interval": interval, "contents": results})
    return payload.reply({**results[items[0].content], "interval": interval})


def _contents(body: dict[str, Any], handout_limit: int) -> list[ContentAnnounce]:
    contents = payload.field(body, "contents", dict)
    if len(contents) > MAX_CONTENTS:
        raise BadRequest(f'field "contents" has {len(contents)} contents; at most '
                         f"{MAX_CONTENTS} per announce")
    items = []
    for key, value in contents.items():
        cid = payload.content_id(key, f'field "contents": key {str(key)[:80]!r}')
        where = f"contents.{cid}."
        if not isinstance(value, dict):
            raise BadRequest(f'field "contents.{cid}" must be an object, '
                             f"not {type(value).__name__}")
        items.append(_one(value, where, cid, handout_limit))
    return items


def _one(obj: dict[str, Any], where: str, cid: ContentId, handout_limit: int) -> ContentAnnounce:
    """One content's fields; in the single-content form they sit at the top level."""
    if not where:
        cid = payload.content_id(payload.field(obj, "content", str), 'field "content"')
    event = obj.get("event")
    if event not in EVENTS:
        raise BadRequest(f'field "{where}event" must be one of "started", "completed", '
                         f'"stopped"; not {str(event)[:40]!r}')
    if event == "stopped":
        return ContentAnnounce(cid, 0, False, 0, event)
    want = handout_limit
    if "want" in obj:  # an agent with enough peers asks for fewer, or none
        want = min(want, payload.count(obj, "want", MAX_HAVE, where))
    origin_bytes = payload.count(obj, "origin_bytes", MAX_BYTES, where) \
        if "origin_bytes" in obj else 0
    return ContentAnnounce(cid, payload.count(obj, "have", MAX_HAVE, where),
                           payload.field(obj, "complete", bool, where), want, event,
                           origin_bytes)


def _addr(body: dict[str, Any], host: str) -> tuple[str, str]:
    """The node's serving address and rack, its address checked against `host`."""
    (addr_host, port), rack = payload.addr(body), payload.text(body, "rack", empty_ok=True)
    if addr_host in UNSPECIFIED_HOSTS:
        addr_host = host
    if addr_host != host:
        raise Forbidden(f'"addr" names host {addr_host}, but the announce came from {host}; '
                        "a node announces the address it is seen at")
    return (f"[{host}]:{port}" if ":" in host else f"{host}:{port}"), rack
