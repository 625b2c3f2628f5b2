"""The tracker's door: who may ask, how much, how fast, and how often.

A signed request (every /v1 route) passes these checks, cheapest first, and
each refusal happens before the next cost is paid:

1. its signature headers are present, well-formed and fresh (401), before a
   byte of the body is read, so an unsigned 4 MiB PUT costs nothing;
2. its source address is within its request rate (429 with Retry-After);
3. its body is read, up to 64 KiB (a manifest PUT: up to the largest manifest
   `p2p.content` allows, with at most `LARGE_BODIES_IN_FLIGHT` such bodies
   read at once, since until the MAC is checked the sender may hold no
   secret), within `body_timeout_seconds` (408);
4. the MAC is verified over method, path, stamp and body (401);
5. a state-changing request (POST, PUT) whose MAC was seen before, while
   its stamp is fresh, is a replay (409) and has no second effect. GETs are
   left out: they change nothing, and two nodes fetching the same manifest
   in the same microsecond legitimately send the same signed request.

Connections are bounded too (`listen`): at most `max_connections` at once (a
new one beyond gets a 503 and is closed, and the log says so, at most every
ten seconds); a connection must deliver a complete request head within
`header_timeout_seconds` of its accept or of its previous response (aiohttp's
keep-alive timer, which also closes idle keep-alive connections).

Identity is an address: `source_host` is the normalised IP a request came
from, which the registry binds peer ids to (see tracker.registry).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from typing import Any, cast

from aiohttp import web
from prometheus_client import Counter

from p2p.auth import MAX_CLOCK_SKEW_SECONDS, check_request_headers, verify_request
from p2p.content import DIGESTS, MAX_CHUNKS, MAX_FIELD_CHARS
from p2p.ratelimit import LogLimiter
from p2p.units import KiB
from p2p.wire import normal_ip
from tracker.config import TrackerConfig
from tracker.limits import KeyedRateLimit, ReplayCache

log = logging.getLogger("bootseer.tracker")

BODY_LIMIT = 64 * KiB
_WIDEST_DIGEST_HEX = 2 * max(width for width, _ in DIGESTS.values())
# The largest manifest p2p.content accepts, as JSON: every digest in hex, quoted, comma.
MANIFEST_BODY_LIMIT = MAX_CHUNKS * (_WIDEST_DIGEST_HEX + 3) + 2 * MAX_FIELD_CHARS + 4 * KiB
LARGE_BODIES_IN_FLIGHT = 2
READ_CHUNK = 64 * KiB
LOG_EVERY_SECONDS = 10.0


class BadRequest(Exception):
    """The client sent something malformed; the message says what (400)."""


class Forbidden(Exception):
    """An identity claim does not match the address it came from (403)."""


class Replayed(Exception):
    """A signed request seen before (409)."""


class SlowClient(Exception):
    """The body did not arrive in time (408)."""


class RateLimited(Exception):
    """Too many requests of one kind from one key (429)."""

    def __init__(self, what: str, retry_after_s: float) -> None:
        super().__init__(f"too many {what}; retry in {retry_after_s:.1f} s")
        self.retry_after_s = retry_after_s


class Unavailable(Exception):
    """The replicas' Redis cannot be reached, or did not apply a request in time (503)."""


def source_host(request: web.BaseRequest) -> str:
    """The address the request came from: the identity every claim is checked against."""
    return cached_normal_ip(request.remote or "")


@functools.lru_cache(maxsize=65536)
def cached_normal_ip(host: str) -> str:
    """p2p.wire.normal_ip, remembered: parsing an address costs more than an announce's
    registry work, and a cluster has a bounded set of them."""
    return normal_ip(host)


class Guard:
    """The checks above, with their memories (replays, rates, log limiter)."""

    def __init__(self, config: TrackerConfig, secret: bytes) -> None:
        self.config = config
        self.secret = secret
        self.replays = ReplayCache(MAX_CLOCK_SKEW_SECONDS, config.replay_cache_entries)
        self.host_rate = KeyedRateLimit(config.host_rate_per_second, config.host_burst)
        self.announce_rate = KeyedRateLimit(config.announce_rate_per_second,
                                            config.announce_burst)
        self.report_rate = KeyedRateLimit(config.report_rate_per_second, config.report_burst)
        self.logs = LogLimiter(LOG_EVERY_SECONDS)
        self._large_bodies = asyncio.Semaphore(LARGE_BODIES_IN_FLIGHT)

    def check_headers(self, request: web.Request) -> None:
        """Step 1 alone, for views that check their URL before the body is read."""
        check_request_headers(request.headers, time.time())

    async def authenticate(self, request: web.Request, limit: int = BODY_LIMIT) -> bytes:
        """The request body, once steps 1-5 of the module docstring pass."""
        signed = check_request_headers(request.headers, time.time())
        self.limit(self.host_rate, source_host(request), "requests from this address")
        if limit > BODY_LIMIT:
            async with self._large_bodies:
                body = await self._read(request, limit)
        else:
            body = await self._read(request, limit)
        verify_request(self.secret, request.method, request.path, body, signed)
        if request.method != "GET":
            refusal = self.replays.check(signed.mac, signed.when, time.time())
            if refusal is not None:
                raise Replayed(refusal)
        return body

    def limit(self, limiter: KeyedRateLimit, key: Any, what: str) -> None:
        """RateLimited if `key` has no token left in `limiter`."""
        wait = limiter.take(key, time.monotonic())
        if wait > 0:
            raise RateLimited(what, wait)

    def log(self, level: int, kind: str, message: str, *args: object) -> None:
        """`log.log(level, message, *args)`, at most once per kind every ten seconds."""
        held = self.logs.allow(kind, time.monotonic())
        if held is None:
            return
        suffix = f" ({held} more like this not logged)" if held else ""
        log.log(level, message + suffix, *args)

    async def _read(self, request: web.Request, limit: int) -> bytes:
        if request.content_length is not None and request.content_length > limit:
            raise BadRequest(f"body of {request.content_length} bytes exceeds the "
                             f"{limit}-byte limit")
        content = request.content
        if content.is_eof():  # a small body usually arrives with the head: no wait
            body = content.read_nowait()
            if len(body) > limit:
                raise BadRequest(f"body exceeds the {limit}-byte limit")
            return body
        buf = bytearray()
        try:
            async with asyncio.timeout(self.config.body_timeout_seconds):
                while chunk := await request.content.read(READ_CHUNK):
                    if len(buf) + len(chunk) > limit:
                        raise BadRequest(f"body exceeds the {limit}-byte limit")
                    buf += chunk
        except TimeoutError:
            raise SlowClient(f"the body did not arrive within "
                             f"{self.config.body_timeout_seconds:g} s") from None
        except (web.RequestPayloadError, ConnectionError) as exc:
            raise BadRequest(f"the body was cut short: {exc}") from None
        return bytes(buf)


# -- connections ----------------------------------------------------------------------

BUSY_REPLY = (b"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\n"
              b"Content-Type: application/json\r\nContent-Length: 56\r\n\r\n"
              b'{"error": "the tracker is at its connection cap; retry"}')


class _Busy(asyncio.Protocol):
    """A connection beyond the cap: one 503, then closed."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        cast(asyncio.Transport, transport).write(BUSY_REPLY)
        transport.close()


class _Counted(asyncio.Protocol):
    """Passes everything to aiohttp's protocol and keeps the open-connection count."""

    def __init__(self, inner: asyncio.Protocol, cap: ConnectionCap) -> None:
        self._inner = inner
        self._cap = cap

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._inner.connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self._cap.open -= 1
        self._inner.connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received()

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()


class ConnectionCap:
    """The listening socket's protocol factory: aiohttp's, up to `limit` open connections."""

    def __init__(self, runner: web.BaseRunner, limit: int, guard: Guard,
                 refused: Counter) -> None:
        assert runner.server is not None, "call runner.setup() first"
        self._server = runner.server
        self.limit = limit
        self.open = 0
        self._guard = guard
        self._refused = refused

    def __call__(self) -> asyncio.Protocol:
        if self.open >= self.limit:
            self._refused.inc()
            self._guard.log(logging.WARNING, "connection-cap",
                            "at the cap of %d open connections: refusing new ones with 503",
                            self.limit)
            return _Busy()
        self.open += 1
        return _Counted(self._server(), self)


async def listen(runner: web.BaseRunner, config: TrackerConfig, guard: Guard,
                 refused: Counter) -> asyncio.Server:
    """Listen on the configured address with the connection cap; OSError if it cannot."""
    loop = asyncio.get_running_loop()
    cap = ConnectionCap(runner, config.max_connections, guard, refused)
    return await loop.create_server(cap, config.host, config.port, reuse_address=True,
                                    backlog=1024)


def runner_options(config: TrackerConfig) -> dict[str, Any]:
    """aiohttp server settings: the request-head deadline, and short lingering."""
    return {"keepalive_timeout": config.header_timeout_seconds, "lingering_time": 1.0}
