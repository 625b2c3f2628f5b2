"""The operator's status page: `GET /` on the tracker, plain HTML, no JavaScript.

One table row per content with members: the names it was given (at most
MAX_NAMES_SHOWN) and its id, its kind and size (from its manifest, when one
is published), swarm size, how many members are complete
and how much of the content the swarm holds on average, the origin fetchers
(slots filled of slots, and who), and the origin egress so far: the bytes
members say they fetched from the origin (`origin_bytes` in their
announces), also as a multiple of the content's size, the number the whole
design is about (about 1x whatever the swarm size). Then one row per node
(peer): where it serves, its rack, in how many contents it is a member and
how many of those it holds whole, and when it last announced; then the
members that left a content before holding it whole (a content every node
gives up on, say its origin answers 404, shows there after its swarm is
gone), the bans in force and the most recent bad-peer reports. The page asks the browser to reload
it every `REFRESH_SECONDS`, so a launch can be watched without a script.

Authentication: like /metrics and /healthz, the page is served without a
signature; it shows peer ids, addresses and report reasons, no secret and no
manifest. A tracker listening beyond a trusted network should be reached
through an authenticating proxy for all three (docs/operating.md says so).

The page is sent with a Content-Security-Policy that allows nothing but its
own inline style, by hash: no script, no frame, no form, no other origin. A
value that escaped its escaping could then still not run or load anything.

Rendering walks each content's members once to average their holdings and
once more for the nodes, and the names once: O(members + names), per page
view, never per announce (a name document is parsed once: names never
change). Every value shown is escaped.
"""

from __future__ import annotations

import base64
import hashlib
import time
from dataclasses import dataclass
from html import escape

import orjson
from aiohttp import web

from p2p.content import ContentId, PeerId
from tracker import names
from tracker.registry import Departure, Member
from tracker.state import TRACKER, Tracker

REFRESH_SECONDS = 2
MAX_FETCHERS_SHOWN = 8
MAX_NAMES_SHOWN = 3

STYLE = """
body { font: 14px/1.4 sans-serif; margin: 1.5em; color: #111; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; }
th, td { border: 1px solid #bbb; padding: 0.3em 0.6em; text-align: right; }
th { background: #eee; } td.l, th.l { text-align: left; }
code { font-size: 12px; }
"""


@dataclass(frozen=True, slots=True)
class ContentInfo:
    """What the page shows of a manifest: read once per content (manifests never change)."""

    kind: str
    size: int
    chunks: int


class StatusPage:
    """Renders the page; keeps the little it learns from manifests."""

    def __init__(self) -> None:
        self._infos: dict[ContentId, ContentInfo | None] = {}
        self._named: dict[str, tuple[str, ContentId]] = {}  # name key -> (name, content)

    def names(self, t: Tracker) -> dict[ContentId, list[str]]:
        """The names of each content this replica holds, sorted."""
        for key, body in t.names.held().items():
            if key not in self._named:
                self._named[key] = names.parse(body)
        out: dict[ContentId, list[str]] = {}
        for name, content in self._named.values():
            out.setdefault(content, []).append(name)
        return {content: sorted(given) for content, given in out.items()}

    def info(self, t: Tracker, content: ContentId) -> ContentInfo | None:
        if content not in self._infos or self._infos[content] is None:
            body = t.manifests.cached(content)
            if body is None:
                return None
            raw = orjson.loads(body)
            size, chunk = int(raw["size"]), int(raw["chunk_size"])
            self._infos[content] = ContentInfo(str(raw["kind"]), size, -(-size // chunk))
        return self._infos[content]

    def render(self, t: Tracker, now: float) -> str:
        reg = t.registry
        named = self.names(t)
        rows = "".join(self._row(t, c, named.get(c, [])) for c in reg.contents()) or \
            '<tr><td class="l" colspan="8">no content has members</td></tr>'
        nodes = "".join(_node_row(peer, seen, now) for peer, seen in _nodes(t).items()) or \
            '<tr><td class="l" colspan="6">none</td></tr>'
        bans = "".join(f'<tr><td class="l"><code>{escape(n)}</code></td><td>{left:.0f}</td></tr>'
                       for n, left in reg.bans(now)) or \
            '<tr><td class="l" colspan="2">none</td></tr>'
        reports = "".join(
            f'<tr><td class="l"><code>{escape(node)}</code></td>'
            f'<td class="l"><code>{escape(r.reporter)}</code></td>'
            f'<td class="l">{escape(r.reason)}</td><td>{now - r.at:.0f}</td></tr>'
            for node, r in reversed(reg.recent_reports())) or \
            '<tr><td class="l" colspan="4">none</td></tr>'
        departed = "".join(self._departure_row(t, d, named, now)
                           for d in reversed(reg.departures())) or \
            '<tr><td class="l" colspan="5">none</td></tr>'
        stamp = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
        return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="refresh" content="{REFRESH_SECONDS}">
<title>Bootseer tracker</title><style>{STYLE}</style></head><body>
<h1>Bootseer tracker</h1>
<p id="summary">{reg.peer_count()} peers in {reg.content_count()} contents;
{len(t.manifests)} manifests, {len(t.names)} names; {reg.member_count()} members in all.
Updated {stamp}, every {REFRESH_SECONDS} s.</p>
<h2>Contents</h2>
<table id="contents"><tr><th class="l">content</th><th>kind</th><th>size</th>
<th>members</th><th>complete</th><th>held (mean)</th><th class="l">origin fetchers</th>
<th>origin egress</th></tr>
{rows}</table>
<h2>Nodes</h2>
<table id="nodes"><tr><th class="l">peer</th><th class="l">serves at</th><th class="l">rack</th>
<th>contents</th><th>complete</th><th>last announce (s ago)</th></tr>
{nodes}</table>
<h2>Left before complete</h2>
<table id="departures"><tr><th class="l">content</th><th class="l">peer</th><th>held</th>
<th class="l">how</th><th>seconds ago</th></tr>
{departed}</table>
<h2>Bans</h2>
<table id="bans"><tr><th class="l">address</th><th>seconds left</th></tr>{bans}</table>
<h2>Recent reports</h2>
<table id="reports"><tr><th class="l">about</th><th class="l">by</th><th class="l">reason</th>
<th>seconds ago</th></tr>{reports}</table>
</body></html>
"""

    def _row(self, t: Tracker, content: ContentId, given: list[str]) -> str:
        reg = t.registry
        members = reg.members(content)
        info = self.info(t, content)
        egress = reg.origin_bytes(content)
        if info is not None and info.chunks:
            held = sum(min(m.have, info.chunks) for m in members) / (len(members) * info.chunks)
            held_text, size_text = f"{held:.0%}", _bytes(info.size)
            ratio = f" ({egress / info.size:.2f}&times;)" if info.size else ""
        else:
            held_text, size_text, ratio = "?", "?", ""
        fetchers = reg.fetchers(content)
        shown = ", ".join(escape(p) for p in fetchers[:MAX_FETCHERS_SHOWN])
        return (f'<tr><td class="l">{_content_cell(content, given)}</td>'
                f'<td>{escape(info.kind) if info else "?"}</td>'
                f"<td>{size_text}</td><td>{len(members)}</td>"
                f"<td>{reg.complete_count(content)}</td><td>{held_text}</td>"
                f'<td class="l">{len(fetchers)}/{reg.origin_fetchers}: {shown}</td>'
                f"<td>{_bytes(egress)}{ratio}</td></tr>\n")

    def _departure_row(self, t: Tracker, d: Departure, named: dict[ContentId, list[str]],
                       now: float) -> str:
        info = self.info(t, d.content)
        held = f"{min(d.have / info.chunks, 1.0):.0%}" if info and info.chunks else \
            f"{d.have} chunks"
        return (f'<tr><td class="l">{_content_cell(d.content, named.get(d.content, []))}</td>'
                f'<td class="l"><code>{escape(d.peer)}</code></td><td>{held}</td>'
                f'<td class="l">{"went silent" if d.went_silent else "stopped"}</td>'
                f"<td>{max(0.0, now - d.at):.0f}</td></tr>\n")


def _content_cell(content: ContentId, given: list[str]) -> str:
    """A content as the page names it: its names (MAX_NAMES_SHOWN at most), then its id."""
    more = len(given) - MAX_NAMES_SHOWN
    shown = "".join(f"{escape(n)}<br>" for n in given[:MAX_NAMES_SHOWN]) + \
        (f"and {more} more<br>" if more > 0 else "")
    return (f'{shown}<code title="{escape(content)}">{escape(content[:19])}&hellip;'
            "</code>")


def _nodes(t: Tracker) -> dict[PeerId, list[Member]]:
    """Each peer's memberships, peers in id order."""
    reg = t.registry
    by_peer: dict[PeerId, list[Member]] = {}
    for content in reg.contents():
        for member in reg.members(content):
            by_peer.setdefault(member.peer, []).append(member)
    return dict(sorted(by_peer.items()))


def _node_row(peer: PeerId, seen: list[Member], now: float) -> str:
    latest = max(seen, key=lambda m: m.last_seen)
    return (f'<tr><td class="l"><code>{escape(peer)}</code></td>'
            f'<td class="l"><code>{escape(latest.addr)}</code></td>'
            f'<td class="l">{escape(latest.rack)}</td><td>{len(seen)}</td>'
            f"<td>{sum(m.complete for m in seen)}</td>"
            f"<td>{max(0.0, now - latest.last_seen):.0f}</td></tr>\n")


def _bytes(n: int) -> str:
    if n < 1000:
        return f"{n} B"
    value, unit = n / 1000, "KB"
    for bigger in ("MB", "GB", "TB"):
        if value < 1000:
            break
        value, unit = value / 1000, bigger
    return f"{value:.1f} {unit}"


STATUS = web.AppKey("status", StatusPage)
_STYLE_HASH = base64.b64encode(hashlib.sha256(STYLE.encode()).digest()).decode()
HEADERS = {
    "Cache-Control": "no-store",
    "Content-Security-Policy": f"default-src 'none'; style-src 'sha256-{_STYLE_HASH}'; "
                               "base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


async def page(request: web.Request) -> web.Response:
    t = request.app[TRACKER]
    html = request.app[STATUS].render(t, time.monotonic())
    return web.Response(text=html, content_type="text/html", charset="utf-8", headers=HEADERS)
