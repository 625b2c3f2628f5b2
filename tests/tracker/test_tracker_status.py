"""The status page in a real headless browser (Debian chromium), over a live tracker.

The browser loads `GET /` from a running tracker whose swarm the test builds
with real announces and reports; the rendered DOM must show that swarm's
numbers, a later load must show the swarm as it has become, and a
screenshot of the page must be a real, non-blank image of the window's size.
"""

from __future__ import annotations

import base64
import hashlib
import re
import shutil
import struct
import subprocess
import zlib
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from test_tracker_service import SECRET, Tracker, manifest, start_tracker

from p2p.content import PeerId
from p2p.tracker_client import ContentState, TrackerClient
from tracker.registry import ORIGIN_FETCHERS

BROWSER_TIMEOUT_SECONDS = 90
WINDOW = (1200, 800)
HOSTS = {"bad": "127.0.0.2", "x": "127.0.0.3", "y": "127.0.0.4", "z": "127.0.0.5",
         "w": "127.0.0.6"}


def chromium() -> str:
    path = shutil.which("chromium")
    if path is None:
        pytest.fail("Debian package chromium is missing: `make setup` installs it")
    return path


def browse(url: str, *flags: str) -> str:
    proc = subprocess.run([chromium(), "--headless", "--no-sandbox", "--disable-gpu",
                           f"--window-size={WINDOW[0]},{WINDOW[1]}", *flags, url],
                          capture_output=True, text=True, timeout=BROWSER_TIMEOUT_SECONDS)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def cells(dom: str, table: str) -> list[list[str]]:
    """The text of each data row of the table with id `table`."""
    body = dom.split(f'id="{table}"', 1)[1].split("</table>", 1)[0]
    rows = re.findall(r"<tr>(.*?)</tr>", body, re.S)[1:]
    return [[re.sub(r"<[^>]+>", "", c).strip()
             for c in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)] for row in rows]


def png_pixels(path: Path) -> tuple[int, int, bytes]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    width, height = struct.unpack(">II", data[16:24])
    idat, pos = b"", 8
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        if kind == b"IDAT":
            idat += data[pos + 8:pos + 8 + length]
        pos += 12 + length
    return width, height, zlib.decompress(idat)


@pytest.fixture
async def tracker(tmp_path: Path) -> AsyncIterator[Tracker]:
    t = await start_tracker(tmp_path, "--peer-ttl", "3600")  # outlives slow browser starts
    assert t.url, t.log.read_text()
    yield t
    assert await t.stop() == 0 and "Traceback" not in t.log.read_text()


async def test_status_page_shows_the_live_swarm_in_a_real_browser(
        tracker: Tracker, tmp_path: Path) -> None:
    m = manifest(b"status page " * 4000)  # 48,000 bytes in 4,096-byte chunks: 12 chunks
    clients = {p: TrackerClient(tracker.url, SECRET, bind_host=h) for p, h in HOSTS.items()}
    try:
        await clients["x"].put_manifest(m)
        await clients["x"].put_name("team/status:v1", m.content_id)
        held = {"bad": (0, 0), "x": (12, 48_000), "y": (6, 24_000)}
        for p, (have, origin) in held.items():
            await clients[p].announce_all(PeerId(p), f"{HOSTS[p]}:7000", "r0", [
                ContentState(m.content_id, have, have == 12, origin_bytes=origin)])
        for state in (ContentState(m.content_id, 3, False), ContentState(m.content_id, 0, False,
                                                                          "stopped")):
            await clients["w"].announce_all(PeerId("w"), f"{HOSTS['w']}:7000", "r0", [state])
        await clients["x"].report(PeerId("x"), PeerId("bad"), m.content_id, "chunk 3 mismatch")
        await clients["y"].report(PeerId("y"), PeerId("bad"), m.content_id, "chunk 5 mismatch")

        dom = browse(tracker.url + "/", "--dump-dom")
        assert 'http-equiv="refresh" content="2"' in dom
        (row,) = cells(dom, "contents")
        assert row[0] == f"team/status:v1{m.content_id[:19]}\u2026"  # name, then the id
        assert row[1:6] == ["blob", "48.0 KB", "3", "1", "50%"]  # (0 + 12 + 6) / (3 * 12)
        assert [r[:5] for r in cells(dom, "nodes")] == [
            ["bad", "127.0.0.2:7000", "r0", "1", "0"], ["x", "127.0.0.3:7000", "r0", "1", "1"],
            ["y", "127.0.0.4:7000", "r0", "1", "0"]]
        assert row[6].startswith(f"2/{ORIGIN_FETCHERS}: bad, y")  # incomplete members, in order
        assert row[7] == "72.0 KB (1.50\u00d7)"
        assert [r[:4] for r in cells(dom, "departures")] == [
            [f"team/status:v1{m.content_id[:19]}\u2026", "w", "25%", "stopped"]]  # 3 of 12
        assert cells(dom, "bans")[0][0] == "127.0.0.2"
        reports = cells(dom, "reports")
        assert [r[:3] for r in reports] == [
            ["127.0.0.2", "127.0.0.4", f"{m.content_id}: chunk 5 mismatch"],
            ["127.0.0.2", "127.0.0.3", f"{m.content_id}: chunk 3 mismatch"]]

        await clients["z"].announce_all(PeerId("z"), f"{HOSTS['z']}:7000", "r1", [
            ContentState(m.content_id, 12, True, origin_bytes=4_096)])
        dom = browse(tracker.url + "/", "--dump-dom")
        (row,) = cells(dom, "contents")
        assert row[3:5] == ["4", "2"] and row[7] == "76.1 KB (1.59\u00d7)"
        assert cells(dom, "nodes")[-1][:5] == ["z", "127.0.0.5:7000", "r1", "1", "1"]

        shot = tmp_path / "status.png"
        browse(tracker.url + "/", f"--screenshot={shot}")
        width, height, pixels = png_pixels(shot)
        assert (width, height) == WINDOW
        assert len(set(pixels)) > 20, "the screenshot is blank"
    finally:
        for c in clients.values():
            await c.close()


async def test_status_page_of_an_empty_tracker_says_so(tracker: Tracker) -> None:
    dom = browse(tracker.url + "/", "--dump-dom")
    assert cells(dom, "contents") == [["no content has members"]]
    assert cells(dom, "nodes") == [["none"]] and cells(dom, "departures") == [["none"]]
    assert cells(dom, "bans") == [["none"]]


async def test_status_page_allows_no_script_and_only_its_own_style(tracker: Tracker) -> None:
    """Issue 34, finding 8: a Content-Security-Policy that the page's own style meets."""
    async with aiohttp.ClientSession() as http, http.get(tracker.url + "/") as resp:
        csp, html = resp.headers.get("Content-Security-Policy", ""), await resp.text()
        assert resp.headers.get("X-Content-Type-Options") == "nosniff"
    directives = dict(d.strip().split(" ", 1) for d in csp.split(";"))
    assert directives["default-src"] == "'none'" and "script-src" not in directives
    assert directives["frame-ancestors"] == "'none'" and directives["form-action"] == "'none'"
    style = html.split("<style>", 1)[1].split("</style>", 1)[0]
    digest = base64.b64encode(hashlib.sha256(style.encode()).digest()).decode()
    assert directives["style-src"] == f"'sha256-{digest}'"  # the browser applies it
