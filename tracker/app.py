"""The tracker's HTTP shell: aiohttp views around the registry and handout policy.

Routes (JSON bodies; every /v1 request is signed with the cluster secret,
see p2p.auth.sign_request, over the URL path):

    POST /v1/announce                  join/refresh a swarm, get peers and origin slot
    POST /v1/report                    report a peer that sent bad chunks
    PUT  /v1/manifests/{content_id}    publish a manifest (201 new, 200 same, 409 other)
    GET  /v1/manifests/{content_id}    fetch a manifest; the body is MAC'd
    GET  /healthz                      liveness and counts (unauthenticated)
    GET  /metrics                      Prometheus text (unauthenticated)

Input is untrusted until proven otherwise: bodies are read up to a per-route
limit, then the signature is checked, then every field is checked for
presence and type. Any of those failing is a 400 (or 401) whose message names
the problem; the catch-all 500 in `_errors` is for our own bugs only.

Time: the registry runs on `time.monotonic()`; request signatures on wall
time, as the signer's clock is another machine's. A background task expires
silent peers every second (or every half TTL, if shorter).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import random
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge
from prometheus_client.exposition import generate_latest

from p2p.auth import BODY_MAC_HEADER, AuthError, check_request, sign_body
from p2p.content import ContentId, KiB, Manifest, ManifestError, MiB, PeerId
from tracker.config import TrackerConfig
from tracker.handout import get_policy
from tracker.registry import Member, Registry

log = logging.getLogger("bootseer.tracker")

ANNOUNCE_BODY_LIMIT = 64 * KiB
REPORT_BODY_LIMIT = 64 * KiB
MANIFEST_BODY_LIMIT = 4 * MiB
MAX_ID_CHARS = 256
MAX_REASON_CHARS = 1024
MAX_HAVE = 2**53
EXPIRE_EVERY_SECONDS = 1.0
ANNOUNCE_EVENTS = (None, "started", "completed", "stopped")
# Manifest ids become file names under state_dir, so they get a strict alphabet.
MANIFEST_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:+=@~-]{0,199}")


class BadRequest(Exception):
    """The client sent something malformed; the message says what."""


class Metrics:
    """The tracker's Prometheus metrics, in a registry of its own (one per app)."""

    def __init__(self, registry: Registry, manifests: ManifestStore) -> None:
        self.collectors = r = CollectorRegistry()
        self.announces = Counter("bootseer_tracker_announces", "Announces handled", registry=r)
        self.expired = Counter("bootseer_tracker_expired_peers",
                               "Members dropped for not announcing", registry=r)
        self.auth_failures = Counter("bootseer_tracker_auth_failures",
                                     "Requests with a missing or bad signature", registry=r)
        self.bad_requests = Counter("bootseer_tracker_bad_requests",
                                    "Requests rejected as malformed", registry=r)
        self.reports = Counter("bootseer_tracker_reports", "Bad-peer reports", registry=r)
        Gauge("bootseer_tracker_peers", "Distinct peers in any swarm",
              registry=r).set_function(registry.peer_count)
        Gauge("bootseer_tracker_contents", "Contents with at least one peer",
              registry=r).set_function(registry.content_count)
        Gauge("bootseer_tracker_manifests", "Manifests held",
              registry=r).set_function(manifests.__len__)


class ManifestConflict(Exception):
    """A different manifest is already published under this content id."""


class ManifestStore:
    """Published manifests, as canonical JSON, persisted under `state_dir` if given."""

    def __init__(self, state_dir: str | None) -> None:
        self._dir = Path(state_dir, "manifests") if state_dir else None
        self._bodies: dict[ContentId, bytes] = {}
        self._lock = asyncio.Lock()

    def __len__(self) -> int:
        return len(self._bodies)

    def load(self) -> None:
        """Read the persisted manifests; a bad file is logged and skipped, not fatal."""
        if self._dir is None:
            return
        self._dir.mkdir(parents=True, exist_ok=True)
        for path in sorted(self._dir.glob("*.json")):
            try:
                manifest = Manifest.from_dict(json.loads(path.read_bytes()))
            except (OSError, ValueError) as exc:
                log.error("skipping unreadable manifest file %s: %s", path, exc)
                continue
            if path.name != f"{manifest.content_id}.json":
                log.error("skipping %s: it holds the manifest of %s", path, manifest.content_id)
                continue
            self._bodies[manifest.content_id] = canonical(manifest)
        log.info("loaded %d manifests from %s", len(self._bodies), self._dir)

    def get(self, content_id: str) -> bytes | None:
        return self._bodies.get(ContentId(content_id))

    async def put(self, manifest: Manifest) -> bool:
        """Store `manifest`; True if new, False if identical; ManifestConflict otherwise."""
        body = canonical(manifest)
        async with self._lock:
            held = self._bodies.get(manifest.content_id)
            if held == body:
                return False
            if held is not None:
                raise ManifestConflict(manifest.content_id)
            if self._dir is not None:
                await asyncio.to_thread(_write_atomically, self._dir, manifest.content_id, body)
            self._bodies[manifest.content_id] = body
            return True


def canonical(manifest: Manifest) -> bytes:
    return json.dumps(manifest.to_dict(), sort_keys=True, separators=(",", ":")).encode()


def _write_atomically(directory: Path, content_id: str, body: bytes) -> None:
    tmp = directory / f".{content_id}.{os.getpid()}.tmp"
    with open(tmp, "wb") as f:
        f.write(body)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, directory / f"{content_id}.json")
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)  # make the rename itself durable
    finally:
        os.close(fd)


class Tracker:
    """Everything the views share: config, secret, registry, manifests, rng, metrics."""

    def __init__(self, config: TrackerConfig, secret: bytes) -> None:
        self.config = config
        self.secret = secret
        self.registry = Registry(ban_seconds=config.ban_seconds,
                                 origin_fetchers=config.origin_fetchers)
        self.manifests = ManifestStore(config.state_dir)
        self.policy = get_policy(config.handout_policy)
        seed = config.seed if config.seed is not None else int.from_bytes(os.urandom(8), "big")
        self.rng = random.Random(seed)
        self.metrics = Metrics(self.registry, self.manifests)


TRACKER = web.AppKey("tracker", Tracker)


# -- input checking -------------------------------------------------------------------


async def _read_body(request: web.Request, limit: int) -> bytes:
    if request.content_length is not None and request.content_length > limit:
        raise BadRequest(f"body of {request.content_length} bytes exceeds the {limit}-byte limit")
    buf = bytearray()
    while chunk := await request.content.read(64 * KiB):
        if len(buf) + len(chunk) > limit:
            raise BadRequest(f"body exceeds the {limit}-byte limit")
        buf += chunk
    return bytes(buf)


async def _authenticated(request: web.Request, limit: int) -> bytes:
    """The request body, once its signature checks out."""
    body = await _read_body(request, limit)
    secret = request.app[TRACKER].secret
    check_request(secret, request.method, request.path, body, request.headers, time.time())
    return body


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


def _addr(obj: dict[str, Any]) -> str:
    addr = _text(obj, "addr")
    host, _, port = addr.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise BadRequest(f'field "addr" must be "host:port", not {addr!r}')
    return addr


def _count(obj: dict[str, Any], name: str, maximum: int) -> int:
    value: int = _field(obj, name, int)
    if not 0 <= value <= maximum:
        raise BadRequest(f'field "{name}" must be in 0..{maximum}, not {value}')
    return value


def _manifest_id(request: web.Request) -> str:
    content_id = request.match_info["content_id"]
    if not MANIFEST_ID.fullmatch(content_id):
        raise BadRequest(f"content id {content_id[:MAX_ID_CHARS]!r} has characters outside "
                         "[A-Za-z0-9._:+=@~-] or is longer than 200")
    return content_id


def _json(payload: object, status: int = 200) -> web.Response:
    return web.json_response(payload, status=status)


# -- views ----------------------------------------------------------------------------


async def _announce(request: web.Request) -> web.Response:
    t = request.app[TRACKER]
    body = _json_object(await _authenticated(request, ANNOUNCE_BODY_LIMIT))
    content, peer = ContentId(_text(body, "content")), PeerId(_text(body, "peer"))
    event = body.get("event")
    if event not in ANNOUNCE_EVENTS:
        raise BadRequest(f'field "event" must be one of "started", "completed", "stopped"; '
                         f"not {str(event)[:40]!r}")
    t.metrics.announces.inc()
    interval = t.config.announce_interval_seconds
    if event == "stopped":
        t.registry.leave(content, peer)
        return _json({"peers": [], "interval": interval, "origin_slot": None,
                      "origin_slots": 1, "origin_filled": 1})
    addr, rack = _addr(body), _text(body, "rack", empty_ok=True)
    have, complete = _count(body, "have", MAX_HAVE), _field(body, "complete", bool)
    limit = t.config.handout_limit
    if "want" in body:  # an agent with enough peers asks for fewer, or none
        limit = min(limit, _count(body, "want", MAX_HAVE))
    now = time.monotonic()
    t.registry.announce(content, Member(peer, addr, rack, have, complete, now), now)
    handed = t.policy(peer, rack, t.registry.candidates(content, now), limit, t.rng)
    peers = [{"peer": m.peer, "addr": m.addr, "rack": m.rack, "have": m.have,
              "complete": m.complete} for m in handed]
    slot = t.registry.origin_slot(content, peer)
    return _json({"peers": peers, "interval": interval, "origin_slot": slot.slot,
                  "origin_slots": slot.slots, "origin_filled": slot.filled})


async def _report(request: web.Request) -> web.Response:
    t = request.app[TRACKER]
    body = _json_object(await _authenticated(request, REPORT_BODY_LIMIT))
    reporter, bad = PeerId(_text(body, "peer")), PeerId(_text(body, "bad_peer"))
    content = _text(body, "content")
    reason = _text(body, "reason", MAX_REASON_CHARS, empty_ok=True)
    t.metrics.reports.inc()
    banned = t.registry.report(bad, reporter, f"{content}: {reason}", time.monotonic())
    log.warning("%s reported %s for %s: %s%s", reporter, bad, content, reason,
                " (now banned from handouts)" if banned else "")
    return _json({"ok": True, "banned": banned})


async def _put_manifest(request: web.Request) -> web.Response:
    t = request.app[TRACKER]
    body = await _authenticated(request, MANIFEST_BODY_LIMIT)
    content_id = _manifest_id(request)
    raw = _json_object(body)
    try:
        manifest = Manifest.from_dict(raw)
    except ManifestError as exc:
        raise BadRequest(f"bad manifest: {exc}") from None
    if manifest.content_id != content_id:
        raise BadRequest(f'manifest "content_id" {manifest.content_id!r} does not match the '
                         f"URL's {content_id!r}")
    try:
        created = await t.manifests.put(manifest)
    except ManifestConflict:
        return _json({"error": f"a different manifest is already published as {content_id}"},
                     status=409)
    if created:
        log.info("published manifest %s (%d chunks)", content_id, manifest.chunks)
    return _json({"ok": True, "created": created}, status=201 if created else 200)


async def _get_manifest(request: web.Request) -> web.Response:
    t = request.app[TRACKER]
    await _authenticated(request, REPORT_BODY_LIMIT)
    content_id = _manifest_id(request)
    body = t.manifests.get(content_id)
    if body is None:
        return _json({"error": f"no manifest is published as {content_id}"}, status=404)
    return web.Response(body=body, content_type="application/json",
                        headers={BODY_MAC_HEADER: sign_body(t.secret, body)})


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
    """Map failures to JSON errors: 400/401 for the client's, 500 for ours."""
    metrics = request.app[TRACKER].metrics
    try:
        return await handler(request)
    except BadRequest as exc:
        metrics.bad_requests.inc()
        log.info("400 %s %s: %s", request.method, request.path, exc)
        return _json({"error": str(exc)}, status=400)
    except AuthError as exc:
        metrics.auth_failures.inc()
        log.warning("401 %s %s from %s: %s", request.method, request.path, request.remote, exc)
        return _json({"error": str(exc)}, status=401)
    except web.HTTPException as exc:  # aiohttp's own 404/405 for unknown routes
        if exc.status < 400:
            raise
        return _json({"error": f"{exc.status} {exc.reason}"}, status=exc.status)
    except Exception:
        log.exception("internal error in %s %s", request.method, request.path)
        return _json({"error": "internal tracker error; see the tracker's log"}, status=500)


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
    """The tracker application; loads persisted manifests (OSError if state_dir is unusable)."""
    tracker = Tracker(config, secret)
    tracker.manifests.load()
    app = web.Application(middlewares=[_errors], client_max_size=MANIFEST_BODY_LIMIT)
    app[TRACKER] = tracker
    app.cleanup_ctx.append(_expiry)
    app.add_routes([
        web.post("/v1/announce", _announce),
        web.post("/v1/report", _report),
        web.put("/v1/manifests/{content_id}", _put_manifest),
        web.get("/v1/manifests/{content_id}", _get_manifest),
        web.get("/healthz", _healthz),
        web.get("/metrics", _metrics),
    ])
    return app
