"""The operator's status page: `GET /` on the tracker, plain HTML, no JavaScript.

One table row per content with members: its kind and size (from its
manifest, when one is published), swarm size, how many members are complete
and how much of the content the swarm holds on average, the origin fetchers
(slots filled of slots, and who), and the origin egress so far: the bytes
members say they fetched from the origin (`origin_bytes` in their
announces), also as a multiple of the content's size, the number the whole
design is about (about 1x whatever the swarm size). Then the bans in force
and the most recent bad-peer reports. The page asks the browser to reload
it every `REFRESH_SECONDS`, so a launch can be watched without a script.

Authentication: like /metrics and /healthz, the page is served without a
signature; it shows peer ids, addresses and report reasons, no secret and no
manifest. A tracker listening beyond a trusted network should be reached
through an authenticating proxy for all three (docs/operating.md says so).

The page is sent with a Content-Security-Policy that allows nothing but its
own inline style, by hash: no script, no frame, no form, no other origin. A
value that escaped its escaping could then still not run or load anything.

Rendering walks each content's members once to average their holdings:
O(members), per page view, never per announce. Every value shown is
escaped.
"""

from __future__ import annotations

import base64
import hashlib
import time
from dataclasses import dataclass
from html import escape

import orjson
from aiohttp import web

from p2p.content import ContentId
from tracker.state import TRACKER, Tracker

REFRESH_SECONDS = 2
MAX_FETCHERS_SHOWN = 8

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
        rows = "".join(self._row(t, c) for c in reg.contents()) or \
            '<tr><td class="l" colspan="8">no content has members</td></tr>'
        bans = "".join(f'<tr><td class="l"><code>{escape(n)}</code></td><td>{left:.0f}</td></tr>'
                       for n, left in reg.bans(now)) or \
            '<tr><td class="l" colspan="2">none</td></tr>'
        reports = "".join(
            f'<tr><td class="l"><code>{escape(node)}</code></td>'
            f'<td class="l"><code>{escape(r.reporter)}</code></td>'
            f'<td class="l">{escape(r.reason)}</td><td>{now - r.at:.0f}</td></tr>'
            for node, r in reversed(reg.recent_reports())) or \
            '<tr><td class="l" colspan="4">none</td></tr>'
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
<h2>Bans</h2>
<table id="bans"><tr><th class="l">address</th><th>seconds left</th></tr>{bans}</table>
<h2>Recent reports</h2>
<table id="reports"><tr><th class="l">about</th><th class="l">by</th><th class="l">reason</th>
<th>seconds ago</th></tr>{reports}</table>
</body></html>
"""

    def _row(self, t: Tracker, content: ContentId) -> str:
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
        return (f'<tr><td class="l"><code title="{escape(content)}">{escape(content[:19])}'
                f'&hellip;</code></td><td>{escape(info.kind) if info else "?"}</td>'
                f"<td>{size_text}</td><td>{len(members)}</td>"
                f"<td>{reg.complete_count(content)}</td><td>{held_text}</td>"
                f'<td class="l">{len(fetchers)}/{reg.origin_fetchers}: {shown}</td>'
                f"<td>{_bytes(egress)}{ratio}</td></tr>\n")


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
