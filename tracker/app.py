"""The tracker's HTTP shell: aiohttp views around the registry and handout policy.

Routes (JSON bodies; every /v1 request is signed with the cluster secret,
see p2p.auth.sign_request, over the URL path):

    POST /v1/announce                  join/refresh a node's swarms, get peers and origin
                                       slots (tracker.announce)
    POST /v1/report                    report a peer that sent bad chunks, or is unreachable
    PUT  /v1/manifests/{content_id}    publish a manifest (201 new, 200 same, 409 other)
    GET  /v1/manifests/{content_id}    fetch a manifest; the body is MAC'd
    PUT  /v1/names/{name}              name a published content (see tracker.names)
    GET  /v1/names/{name}              resolve a name; the body is MAC'd
    GET  /                             the operators' status page, HTML (unauthenticated;
                                       tracker.status)
    GET  /healthz                      liveness and counts (unauthenticated); 503 when a
                                       replica's log reader stopped
    GET  /metrics                      Prometheus text (unauthenticated)

Input is untrusted until proven otherwise: tracker.guard checks the signature
headers, rates and the MAC (and reads the body, bounded) before a view looks
at a field; then tracker.payload checks every field for presence and type,
and every content id with p2p.content.check_content_id. Failures are mapped once, in
`_errors`: 400 malformed, 401 unauthenticated, 403 an identity claim that does
not match its source address, 408 too slow, 409 conflict or replay, 429 too
many; the catch-all 500 is for our own bugs only.

This module builds the app and holds the report view, health and metrics;
the announce view is tracker.announce, the manifest and name views are
tracker.content_views;
what every view shares, the `Tracker` at `app[TRACKER]`, is tracker.state.

Identity: the source address of a request is the node (tracker.registry). An
announce's `addr` must name that address (an unspecified host, 0.0.0.0 or
::, is replaced by it); a peer id bound to one address cannot announce, stop
or report from another.

Time: the registry and rate limits run on `time.monotonic()`; request
signatures on wall time, as the signer's clock is another machine's. A
background task expires silent peers every second (or every half TTL).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import AsyncIterator, Awaitable, Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.exposition import generate_latest

from p2p.auth import AuthError
from p2p.content import PeerId
from tracker import announce, content_views, payload, status
from tracker.config import TrackerConfig
from tracker.guard import (
    MANIFEST_BODY_LIMIT,
    BadRequest,
    Forbidden,
    RateLimited,
    Replayed,
    SlowClient,
    Unavailable,
    source_host,
)
from tracker.machine import UNREACHABLE, Report, ReportResult, Tick
from tracker.registry import IdentityError
from tracker.state import TRACKER, Tracker

log = logging.getLogger("bootseer.tracker")

MAX_REASON_CHARS = 1024
EXPIRE_EVERY_SECONDS = 1.0

__all__ = ["TRACKER", "make_app"]


# -- swarm views ----------------------------------------------------------------------


async def _report(request: web.Request) -> web.Response:
    t = request.app[TRACKER]
    body = payload.json_object(await t.guard.authenticate(request))
    host = source_host(request)
    reporter, bad = PeerId(payload.text(body, "peer")), PeerId(payload.text(body, "bad_peer"))
    content = payload.content_id(payload.field(body, "content", str), 'field "content"')
    reason = payload.text(body, "reason", MAX_REASON_CHARS, empty_ok=True)
    seen_at = payload.seen_at(body)
    t.guard.limit(t.guard.report_rate, host, "reports from this address")
    t.metrics.reports.inc()
    result: ReportResult = await t.core.submit(
        Report(reporter, bad, content, reason, host, seen_at))
    if reason == UNREACHABLE:
        t.guard.log(logging.INFO, "unreachable", "%s at %s cannot reach %s in %s%s",
                    reporter, host, bad, content,
                    " (its origin slot is freed)" if result.freed else "")
        return payload.reply({"ok": True, "banned": False})
    level = logging.WARNING if result.banned else logging.INFO
    t.guard.log(level, f"report-{result.banned}", "%s at %s reported %s (seen at %s) for "
                "%s: %s%s", reporter, host, bad, seen_at or "its bound address", content,
                reason, " (that address is now banned from handouts)" if result.banned else "")
    return payload.reply({"ok": True, "banned": result.banned})


# -- unauthenticated views, errors, lifecycle -----------------------------------------


async def _healthz(request: web.Request) -> web.Response:
    """200 with counts; 503 when this replica cannot apply ops (its log reader stopped)."""
    t = request.app[TRACKER]
    problem = t.core.problem()
    if problem is not None:
        return payload.reply({"ok": False, "error": problem}, status=503)
    return payload.reply({"ok": True, "peers": t.registry.peer_count(),
                          "contents": t.registry.content_count()})


async def _metrics(request: web.Request) -> web.Response:
    body = generate_latest(request.app[TRACKER].metrics.collectors)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Map failures to JSON errors (see the module docstring); close if the body is unread."""
    try:
        return await handler(request)
    except web.HTTPException as exc:  # aiohttp's own 404/405 for unknown routes
        if exc.status < 400:
            raise
        return payload.reply({"error": f"{exc.status} {exc.reason}"}, status=exc.status)
    except Exception as exc:
        resp = _refusal(request, exc)
        if not request.content.at_eof():
            resp.force_close()  # do not wait for a body we will not read
        return resp


def _refusal(request: web.Request, exc: Exception) -> web.Response:
    t = request.app[TRACKER]
    m, where = t.metrics, f"{request.method} {request.path[:200]} from {request.remote}"
    status, counter, level = {
        BadRequest: (400, m.bad_requests, logging.INFO),
        AuthError: (401, m.auth_failures, logging.WARNING),
        Forbidden: (403, m.forbidden, logging.WARNING),
        IdentityError: (403, m.forbidden, logging.WARNING),
        SlowClient: (408, m.slow_clients, logging.INFO),
        Replayed: (409, m.replays, logging.WARNING),
        RateLimited: (429, m.rate_limited, logging.WARNING),
        Unavailable: (503, m.unavailable, logging.WARNING),
    }.get(type(exc), (500, None, logging.ERROR))
    if counter is None:
        log.exception("internal error in %s", where, exc_info=exc)
        return payload.reply({"error": "internal tracker error; see the tracker's log"}, status=500)
    counter.inc()
    t.guard.log(level, f"refusal-{status}", "%d %s: %s", status, where, exc)
    resp = payload.reply({"error": str(exc)}, status=status)
    if isinstance(exc, RateLimited):
        resp.headers["Retry-After"] = str(max(1, math.ceil(exc.retry_after_s)))
    return resp


async def _expiry(app: web.Application) -> AsyncIterator[None]:
    """Tick the core every second (or every half TTL) for the app's lifetime."""
    t = app[TRACKER]
    every = min(EXPIRE_EVERY_SECONDS, t.config.peer_ttl_seconds / 2)

    async def loop() -> None:
        while True:
            await asyncio.sleep(every)
            with contextlib.suppress(Unavailable):  # the log is down: nothing expires now
                await t.core.append(Tick())

    task = asyncio.create_task(loop(), name="tracker-expiry")
    yield
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def _replicas(app: web.Application) -> AsyncIterator[None]:
    """With `redis_url`: join the replicas' shared log (Unavailable if Redis is not there)."""
    t = app[TRACKER]
    if t.config.redis_url is None:
        yield
        return
    from tracker.replicas import Replicas  # only replicas load the Redis client

    replicas = Replicas(t.config, t.secret, t.machine, t.expired,
                        (t.manifests, t.names, t.origins), t.metrics)
    await replicas.start()
    t.core = t.manifests.shared = t.names.shared = t.origins.shared = replicas
    try:
        yield
    finally:
        await replicas.close()


def make_app(config: TrackerConfig, secret: bytes) -> web.Application:
    """The tracker application; loads persisted documents (OSError if state_dir is unusable)."""
    tracker = Tracker(config, secret)
    tracker.manifests.load()
    tracker.names.load()
    tracker.origins.load()
    app = web.Application(middlewares=[_errors], client_max_size=MANIFEST_BODY_LIMIT)
    app[TRACKER] = tracker
    app[status.STATUS] = status.StatusPage()
    app.cleanup_ctx.append(_replicas)
    app.cleanup_ctx.append(_expiry)
    app.add_routes([
        web.post("/v1/announce", announce.announce),
        web.post("/v1/report", _report),
        web.put("/v1/manifests/{content_id}", content_views.put_manifest),
        web.get("/v1/manifests/{content_id}", content_views.get_manifest),
        web.put(r"/v1/names/{name:.+}", content_views.put_name),
        web.get(r"/v1/names/{name:.+}", content_views.get_name),
        web.get("/", status.page),
        web.get("/healthz", _healthz),
        web.get("/metrics", _metrics),
    ])
    return app
