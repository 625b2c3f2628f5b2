"""A small HTTP origin: serves a directory with Range requests, optionally capped.

`bootseer origin DIR` stands in for an object store or artifact server in the
demo, the benchmarks and the tests. It counts every byte it sends (GET /stats)
so that origin egress is measured where it happens, and it can cap its total
egress rate (`--rate-mbps`) to model a shared origin. Range handling follows
RFC 9110 for a single `bytes=a-b` range, which is all the agents send.
"""

from __future__ import annotations

import asyncio
import os
import re
from pathlib import Path

from aiohttp import web

from p2p.peer import listen_socket
from p2p.ratelimit import TokenBucket

BLOCK = 1 << 20
_RANGE = re.compile(r"bytes=(\d+)-(\d*)$")


class OriginServer:
    def __init__(self, root: Path, rate_bytes_per_s: float | None) -> None:
        self.root = root.resolve()
        self.bytes_sent = 0
        self.requests = 0
        self._bucket = TokenBucket(rate_bytes_per_s, burst_bytes=BLOCK)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/stats", self.stats)
        app.router.add_get("/{name:.+}", self.serve)
        return app

    async def stats(self, request: web.Request) -> web.Response:
        return web.json_response({"bytes_sent": self.bytes_sent, "requests": self.requests})

    async def serve(self, request: web.Request) -> web.StreamResponse:
        path = (self.root / request.match_info["name"]).resolve()
        if self.root not in path.parents or not path.is_file():
            raise web.HTTPNotFound(text=f"no such file: {request.match_info['name']}\n")
        size = path.stat().st_size
        start, end = 0, size - 1
        status = 200
        if (header := request.headers.get("Range")) is not None:
            match = _RANGE.match(header.strip())
            if not match:
                raise web.HTTPRequestRangeNotSatisfiable(text=f"unsupported range {header}\n")
            start = int(match[1])
            end = min(int(match[2]) if match[2] else size - 1, size - 1)
            if start > end:
                raise web.HTTPRequestRangeNotSatisfiable(text=f"range {header} outside {size}\n")
            status = 206
        self.requests += 1
        if self._bucket.unlimited:
            # Uncapped: aiohttp's FileResponse answers the range with zero-copy sendfile.
            # It is returned unprepared: aiohttp prepares what a handler returns, and a
            # FileResponse prepared twice sets its status again, which aiohttp refuses
            # with a traceback in the log for every request.
            self.bytes_sent += end - start + 1
            return web.FileResponse(path)
        resp = web.StreamResponse(status=status)
        resp.content_length = end - start + 1
        if status == 206:
            resp.headers["Content-Range"] = f"bytes {start}-{end}/{size}"
        await resp.prepare(request)
        with open(path, "rb") as f:
            f.seek(start)
            left = end - start + 1
            while left:
                block = f.read(min(BLOCK, left))
                if not block:
                    break
                await self._pace(len(block))
                await resp.write(block)
                self.bytes_sent += len(block)
                left -= len(block)
        await resp.write_eof()
        return resp

    async def _pace(self, n: int) -> None:
        # One bucket shared by every request: the cap is on total egress.
        wait = self._bucket.reserve(n, asyncio.get_running_loop().time())
        if wait > 0:
            await asyncio.sleep(wait)


async def start(root: Path, host: str, port: int,
                rate_mbps: float | None) -> tuple[web.AppRunner, str]:
    """Serve `root` at host:port; returns the runner (to clean up) and the URL.

    The socket is bound before this returns, so a busy port is an OSError here, to
    the caller, rather than in a task nobody awaits.
    """
    sock = listen_socket(host, port)
    server = OriginServer(root, rate_mbps * 1e6 if rate_mbps else None)
    runner = web.AppRunner(server.app(), access_log=None)
    await runner.setup()
    await web.SockSite(runner, sock).start()
    url = f"http://{host}:{sock.getsockname()[1]}"
    print(f'{{"event": "listening", "url": "{url}", "pid": {os.getpid()}}}', flush=True)
    return runner, url
