"""The tracker's HTTP shell: aiohttp views around the registry and handout policy.

Routes (JSON bodies; every /v1 request is signed with the cluster secret,
see p2p.auth.sign_request, over the URL path):

    POST /v1/announce                  join/refresh a swarm, get peers and origin slot
    POST /v1/report                    report a peer that sent bad chunks, or is unreachable
    PUT  /v1/manifests/{content_id}    publish a manifest (201 new, 200 same, 409 other)
    GET  /v1/manifests/{content_id}    fetch a manifest; the body is MAC'd
    PUT  /v1/names/{name}              name a published content (see tracker.names)
    GET  /v1/names/{name}              resolve a name; the body is MAC'd
    GET  /healthz                      liveness and counts (unauthenticated)
    GET  /metrics                      Prometheus text (unauthenticated)

Input is untrusted until proven otherwise: tracker.guard checks the signature
headers, rates and the MAC (and reads the body, bounded) before a view looks
at a field; then every field is checked for presence and type, and every
content id with p2p.content.check_content_id. Failures are mapped once, in
`_errors`: 400 malformed, 401 unauthenticated, 403 an identity claim that does
not match its source address, 408 too slow, 409 conflict or replay, 429 too
many; the catch-all 500 is for our own bugs only.

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
import ipaddress
import json
import logging
import math
import os
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge
from prometheus_client.exposition import generate_latest

from p2p.auth import BODY_MAC_HEADER, AuthError, sign_body
from p2p.content import ContentId, Manifest, ManifestError, PeerId, check_content_id
from p2p.wire import normal_ip
from tracker import names
from tracker.config import TrackerConfig
from tracker.guard import (
    MANIFEST_BODY_LIMIT,
    BadRequest,
    Forbidden,
    Guard,
    RateLimited,
    Replayed,
    SlowClient,
    source_host,
)
from tracker.handout import get_policy
from tracker.registry import IdentityError, Member, Registry
from tracker.store import Conflict, Documents

log = logging.getLogger("bootseer.tracker")

MAX_ID_CHARS = 256
MAX_REASON_CHARS = 1024
MAX_HAVE = 2**53
EXPIRE_EVERY_SECONDS = 1.0
ANNOUNCE_EVENTS = (None, "started", "completed", "stopped")
UNREACHABLE = "unreachable"  # a report reason: could not dial the peer (frees its slot)
UNSPECIFIED_HOSTS = ("0.0.0.0", "::")


class Metrics:
    """The tracker's Prometheus metrics, in a registry of its own (one per app)."""

    def __init__(self, t: Tracker) -> None:
        self.collectors = r = CollectorRegistry()

        def counter(name: str, doc: str) -> Counter:
            return Counter(f"bootseer_tracker_{name}", doc, registry=r)

        def gauge(name: str, doc: str, value: Callable[[], float]) -> None:
            Gauge(f"bootseer_tracker_{name}", doc, registry=r).set_function(value)

        self.announces = counter("announces", "Announces handled")
        self.expired = counter("expired_peers", "Members dropped for not announcing")
        self.auth_failures = counter("auth_failures", "Requests with a missing or bad signature")
        self.bad_requests = counter("bad_requests", "Requests rejected as malformed")
        self.reports = counter("reports", "Bad-peer reports")
        self.forbidden = counter("forbidden", "Identity claims refused (403)")
        self.replays = counter("replays", "Replayed signed requests refused")
        self.rate_limited = counter("rate_limited", "Requests refused for their rate (429)")
        self.slow_clients = counter("slow_clients", "Bodies that did not arrive in time (408)")
        self.refused_connections = counter("refused_connections",
                                           "Connections refused at the connection cap")
        gauge("peers", "Distinct peers in any swarm", t.registry.peer_count)
        gauge("contents", "Contents with at least one peer", t.registry.content_count)
        gauge("manifests", "Manifests held", t.manifests.__len__)
        gauge("names", "Names held", t.names.__len__)
        gauge("banned", "Addresses banned from handouts", lambda: len(
            t.registry.banned(time.monotonic())))
        gauge("fetchers_reassigned", "Origin-fetcher slots taken from stalled, unreachable "
              "or banned fetchers (a running count)", lambda: t.registry.fetchers_reassigned)


def _check_manifest_file(body: bytes, key: str) -> bytes:
    try:
        manifest = Manifest.from_dict(json.loads(body))
    except (ValueError, RecursionError) as exc:  # ManifestError is a ValueError
        raise ValueError(str(exc)) from None
    if manifest.content_id != key:
        raise ValueError(f"it holds the manifest of {manifest.content_id}")
    return canonical(manifest)


def canonical(manifest: Manifest) -> bytes:
    return json.dumps(manifest.to_dict(), sort_keys=True, separators=(",", ":")).encode()


class Tracker:
    """Everything the views share: config, guard, registry, documents, rng, metrics."""

    def __init__(self, config: TrackerConfig, secret: bytes) -> None:
        self.config = config
        self.secret = secret
        self.guard = Guard(config, secret)
        self.registry = Registry(ban_seconds=config.ban_seconds,
                                 origin_fetchers=config.origin_fetchers,
                                 fetcher_stall_seconds=config.fetcher_stall_seconds)
        self.manifests = Documents(config.state_dir, "manifests", check_content_id,
                                   _check_manifest_file)
        self.names = Documents(config.state_dir, "names", names.check_file_key,
                               names.check_document)
        self.policy = get_policy(config.handout_policy)
        seed = config.seed if config.seed is not None else int.from_bytes(os.urandom(8), "big")
        self.rng = random.Random(seed)
        self.metrics = Metrics(self)


TRACKER = web.AppKey("tracker", Tracker)


# -- input checking -------------------------------------------------------------------


def _json_object(body: bytes) -> dict[str, Any]:
    try:
        value = json.loads(body)
    except (ValueError, RecursionError) as exc:  # RecursionError: absurdly deep nesting
        raise BadRequest(f"body is not valid JSON: {str(exc)[:200]}") from None
    if not isinstance(value, dict):
        raise BadRequest(f"body must be a JSON object, not {type(value).__name__}")
    return value


def _field(obj: dict[str, Any], name: str, kind: type) -> Any:
    if name not in obj:
        raise BadRequest(f'missing field "{name}"')
    value = obj[name]
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        raise BadRequest(f'field "{name}" must be {kind.__name__}, not {type(value).__name__}')
    return value


def _text(obj: dict[str, Any], name: str, max_chars: int = MAX_ID_CHARS,
          empty_ok: bool = False) -> str:
    value: str = _field(obj, name, str)
    if not value and not empty_ok:
        raise BadRequest(f'field "{name}" must not be empty')
    if len(value) > max_chars or not value.isprintable():
        raise BadRequest(f'field "{name}" must be printable and at most {max_chars} characters')
    return value


def _content_id(text: object, where: str) -> ContentId:
    try:
        return check_content_id(text)
    except ManifestError as exc:
        raise BadRequest(f"{where}: {exc}") from None


def _addr(obj: dict[str, Any]) -> tuple[str, str]:
    """The `addr` field as (host, port), the host normalised."""
    addr = _text(obj, "addr")
    host, _, port = addr.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise BadRequest(f'field "addr" must be "host:port", not {addr!r}')
    return normal_ip(host), port


def _seen_at(obj: dict[str, Any]) -> str | None:
    """A report's optional `addr`: the IP (or "IP:port") the offender was seen at."""
    if obj.get("addr") is None:
        return None
    text = _text(obj, "addr")
    host = _ip(text) or _ip(text.rpartition(":")[0])
    if host is None:
        raise BadRequest(f'field "addr" must be the IP address (or "IP:port") the peer was '
                         f"seen at, not {text[:80]!r}")
    return host


def _ip(text: str) -> str | None:
    try:
        return normal_ip(str(ipaddress.ip_address(text.strip("[]"))))
    except ValueError:
        return None


def _count(obj: dict[str, Any], name: str, maximum: int) -> int:
    value: int = _field(obj, name, int)
    if not 0 <= value <= maximum:
        raise BadRequest(f'field "{name}" must be in 0..{maximum}, not {value}')
    return value


def _json(payload: object, status: int = 200) -> web.Response:
    return web.json_response(payload, status=status)


def _signed(t: Tracker, body: bytes) -> web.Response:
    return web.Response(body=body, content_type="application/json",
                        headers={BODY_MAC_HEADER: sign_body(t.secret, body)})


# -- swarm views ----------------------------------------------------------------------


async def _announce(request: web.Request) -> web.Response:
    t = request.app[TRACKER]
    body = _json_object(await t.guard.authenticate(request))
    host = source_host(request)
    content = _content_id(_field(body, "content", str), 'field "content"')
    peer = PeerId(_text(body, "peer"))
    event = body.get("event")
    if event not in ANNOUNCE_EVENTS:
        raise BadRequest(f'field "event" must be one of "started", "completed", "stopped"; '
                         f"not {str(event)[:40]!r}")
    t.guard.limit(t.guard.announce_rate, (host, peer, content), "announces for this content")
    t.metrics.announces.inc()
    interval = t.config.announce_interval_seconds
    if event == "stopped":
        t.registry.leave(content, peer, host)
        return _json({"peers": [], "interval": interval, "origin_slot": None,
                      "origin_slots": 1, "origin_filled": 1})
    (addr_host, port), rack = _addr(body), _text(body, "rack", empty_ok=True)
    have, complete = _count(body, "have", MAX_HAVE), _field(body, "complete", bool)
    limit = t.config.handout_limit
    if "want" in body:  # an agent with enough peers asks for fewer, or none
        limit = min(limit, _count(body, "want", MAX_HAVE))
    if addr_host in UNSPECIFIED_HOSTS:
        addr_host = host
    if addr_host != host:
        raise Forbidden(f'"addr" names host {addr_host}, but the announce came from {host}; '
                        "a node announces the address it is seen at")
    now = time.monotonic()
    addr = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    t.registry.announce(content, Member(peer, addr, rack, have, complete, now, host), now)
    handed = t.policy(peer, rack, t.registry.candidates(content, now), limit, t.rng)
    peers = [{"peer": m.peer, "addr": m.addr, "rack": m.rack, "have": m.have,
              "complete": m.complete} for m in handed]
    slot = t.registry.origin_slot(content, peer)
    return _json({"peers": peers, "interval": interval, "origin_slot": slot.slot,
                  "origin_slots": slot.slots, "origin_filled": slot.filled})


async def _report(request: web.Request) -> web.Response:
    t = request.app[TRACKER]
    body = _json_object(await t.guard.authenticate(request))
    host = source_host(request)
    reporter, bad = PeerId(_text(body, "peer")), PeerId(_text(body, "bad_peer"))
    content = _content_id(_field(body, "content", str), 'field "content"')
    reason = _text(body, "reason", MAX_REASON_CHARS, empty_ok=True)
    seen_at = _seen_at(body)
    t.guard.limit(t.guard.report_rate, host, "reports from this address")
    t.metrics.reports.inc()
    if reason == UNREACHABLE:
        t.registry.reporter_node(reporter, host)  # only members may say so
        freed = t.registry.fetcher_unreachable(content, bad)
        t.guard.log(logging.INFO, "unreachable", "%s at %s cannot reach %s in %s%s",
                    reporter, host, bad, content, " (its origin slot is freed)" if freed else "")
        return _json({"ok": True, "banned": False})
    banned = t.registry.report(bad, reporter, f"{content}: {reason}", time.monotonic(),
                               host=seen_at, reporter_host=host)
    level = logging.WARNING if banned else logging.INFO
    t.guard.log(level, f"report-{banned}", "%s at %s reported %s (seen at %s) for %s: %s%s",
                reporter, host, bad, seen_at or "its bound address", content, reason,
                " (that address is now banned from handouts)" if banned else "")
    return _json({"ok": True, "banned": banned})


# -- documents: manifests and names ---------------------------------------------------


def _url_content_id(request: web.Request) -> ContentId:
    return _content_id(request.match_info["content_id"], "the URL's content id")


def _url_name(request: web.Request) -> str:
    try:
        return names.check_name(request.match_info["name"])
    except ValueError as exc:
        raise BadRequest(str(exc)) from None


async def _put_manifest(request: web.Request) -> web.Response:
    t = request.app[TRACKER]
    t.guard.check_headers(request)
    content_id = _url_content_id(request)
    raw = _json_object(await t.guard.authenticate(request, MANIFEST_BODY_LIMIT))
    try:
        manifest = Manifest.from_dict(raw)
    except ManifestError as exc:
        raise BadRequest(f"bad manifest: {exc}") from None
    if manifest.content_id != content_id:
        raise BadRequest(f'manifest "content_id" {manifest.content_id!r} does not match the '
                         f"URL's {content_id!r}")
    try:
        created = await t.manifests.put(content_id, canonical(manifest))
    except Conflict:
        return _json({"error": f"a different manifest is already published as {content_id}"},
                     status=409)
    if created:
        log.info("published manifest %s (%d chunks)", content_id, manifest.chunks)
    return _json({"ok": True, "created": created}, status=201 if created else 200)


async def _get_manifest(request: web.Request) -> web.Response:
    t = request.app[TRACKER]
    t.guard.check_headers(request)
    content_id = _url_content_id(request)
    await t.guard.authenticate(request)
    body = t.manifests.get(content_id)
    if body is None:
        return _json({"error": f"no manifest is published as {content_id}"}, status=404)
    return _signed(t, body)


async def _put_name(request: web.Request) -> web.Response:
    t = request.app[TRACKER]
    t.guard.check_headers(request)
    name = _url_name(request)
    body = _json_object(await t.guard.authenticate(request))
    content_id = _content_id(_field(body, "content_id", str), 'field "content_id"')
    if t.manifests.get(content_id) is None:
        return _json({"error": f"no manifest is published as {content_id}; publish it "
                      "before naming it"}, status=404)
    try:
        created = await t.names.put(names.file_key(name), names.canonical(name, content_id))
    except Conflict as exc:
        holder = names.parse(exc.held)[1]
        return _json({"error": f"the name {name!r} already names {holder}; names are "
                      "never changed", "content_id": holder}, status=409)
    if created:
        log.info("named %s %r", content_id, name)
    return _json({"ok": True, "created": created}, status=201 if created else 200)


async def _get_name(request: web.Request) -> web.Response:
    t = request.app[TRACKER]
    t.guard.check_headers(request)
    name = _url_name(request)
    await t.guard.authenticate(request)
    body = t.names.get(names.file_key(name))
    if body is None:
        return _json({"error": f"no content is named {name!r}"}, status=404)
    return _signed(t, body)


# -- unauthenticated views, errors, lifecycle -----------------------------------------


async def _healthz(request: web.Request) -> web.Response:
    registry = request.app[TRACKER].registry
    return _json({"ok": True, "peers": registry.peer_count(),
                  "contents": registry.content_count()})


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
        return _json({"error": f"{exc.status} {exc.reason}"}, status=exc.status)
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
    }.get(type(exc), (500, None, logging.ERROR))
    if counter is None:
        log.exception("internal error in %s", where, exc_info=exc)
        return _json({"error": "internal tracker error; see the tracker's log"}, status=500)
    counter.inc()
    t.guard.log(level, f"refusal-{status}", "%d %s: %s", status, where, exc)
    resp = _json({"error": str(exc)}, status=status)
    if isinstance(exc, RateLimited):
        resp.headers["Retry-After"] = str(max(1, math.ceil(exc.retry_after_s)))
    return resp


async def _expiry(app: web.Application) -> AsyncIterator[None]:
    """Run the expiry loop for the app's lifetime; cancelled on shutdown."""
    t = app[TRACKER]
    every = min(EXPIRE_EVERY_SECONDS, t.config.peer_ttl_seconds / 2)

    async def loop() -> None:
        while True:
            await asyncio.sleep(every)
            gone = t.registry.expire(time.monotonic(), t.config.peer_ttl_seconds)
            if gone:
                t.metrics.expired.inc(len(gone))
                log.info("expired %d silent members", len(gone))

    task = asyncio.create_task(loop(), name="tracker-expiry")
    yield
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


def make_app(config: TrackerConfig, secret: bytes) -> web.Application:
    """The tracker application; loads persisted documents (OSError if state_dir is unusable)."""
    tracker = Tracker(config, secret)
    tracker.manifests.load()
    tracker.names.load()
    app = web.Application(middlewares=[_errors], client_max_size=MANIFEST_BODY_LIMIT)
    app[TRACKER] = tracker
    app.cleanup_ctx.append(_expiry)
    app.add_routes([
        web.post("/v1/announce", _announce),
        web.post("/v1/report", _report),
        web.put("/v1/manifests/{content_id}", _put_manifest),
        web.get("/v1/manifests/{content_id}", _get_manifest),
        web.put(r"/v1/names/{name:.+}", _put_name),
        web.get(r"/v1/names/{name:.+}", _get_name),
        web.get("/healthz", _healthz),
        web.get("/metrics", _metrics),
    ])
    return app
