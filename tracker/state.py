"""What every view of the tracker shares: the `Tracker` at `app[TRACKER]`.

One `Tracker` per application holds the config, the request guard, the
registry of swarm members and the state machine that changes it
(tracker.machine), the core that applies ops to it, the persisted documents
(manifests and names), and the Prometheus metrics. The views (tracker.app,
tracker.announce, tracker.content_views) find it with `request.app[TRACKER]`.

The core is `LocalCore` for one process: an op is applied when its request
arrives, on this process's clock and seeded rng. With `redis_url`, the app
replaces it with `tracker.replicas.Replicas` at start-up: ops go through the
log every replica applies. Both have `submit(op) -> reply` and
`append(op)`.

A manifest is stored in one canonical JSON spelling (`canonical`), so that the
same manifest published twice is the same bytes, and a file loaded from the
state dir is checked to hold the manifest its name says.
"""

from __future__ import annotations

import json
import logging
import os
import random
import time
from collections.abc import Callable
from typing import Any, Protocol

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge

from p2p.content import Manifest, check_content_id
from tracker import names, origins
from tracker.config import TrackerConfig
from tracker.guard import Guard
from tracker.handout import get_policy
from tracker.machine import Machine, Op, Tick
from tracker.registry import Registry
from tracker.store import Documents

log = logging.getLogger("bootseer.tracker")


class Metrics:
    """The tracker's Prometheus metrics, in a registry of its own (one per app)."""

    def __init__(self, t: Tracker) -> None:
        self.collectors = r = CollectorRegistry()

        def counter(name: str, doc: str) -> Counter:
            return Counter(f"bootseer_tracker_{name}", doc, registry=r)

        def gauge(name: str, doc: str, value: Callable[[], float]) -> None:
            Gauge(f"bootseer_tracker_{name}", doc, registry=r).set_function(value)

        self.announces = counter("announces", "Announce requests handled (one per node and "
                                 "interval, for all its contents)")
        self.content_announces = counter("content_announces",
                                         "Contents announced (a batched announce counts each)")
        self.expired = counter("expired_peers", "Members dropped for not announcing")
        self.auth_failures = counter("auth_failures", "Requests with a missing or bad signature")
        self.bad_requests = counter("bad_requests", "Requests rejected as malformed")
        self.reports = counter("reports", "Bad-peer reports")
        self.forbidden = counter("forbidden", "Identity claims refused (403)")
        self.replays = counter("replays", "Replayed signed requests refused")
        self.rate_limited = counter("rate_limited", "Requests refused for their rate (429)")
        self.slow_clients = counter("slow_clients", "Bodies that did not arrive in time (408)")
        self.unavailable = counter("unavailable", "Requests answered 503 because the "
                                   "replicas' Redis was unreachable or slow")
        self.log_entries_skipped = counter(
            "log_entries_skipped", "Replica log entries skipped: malformed, not MAC'd by a "
            "replica, or tripping the state machine (see the log)")
        self.snapshots_refused = counter("snapshots_refused", "Replica snapshots in Redis "
                                         "refused as malformed or not MAC'd by a replica")
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


class Core(Protocol):
    async def submit(self, op: Op) -> Any: ...

    async def append(self, op: Op) -> None: ...

    def problem(self) -> str | None:
        """Why this core cannot apply ops now (for /healthz), or None."""


class LocalCore:
    """One process: ops applied as they arrive, at `time.monotonic()`, with one rng."""

    def __init__(self, machine: Machine, rng: random.Random,
                 on_expired: Callable[[int], None]) -> None:
        self._machine = machine
        self._rng = rng
        self._on_expired = on_expired

    async def submit(self, op: Op) -> Any:
        result = self._machine.apply(op, time.monotonic(), self._rng)
        if isinstance(op, Tick) and result:
            self._on_expired(len(result))
        return result

    async def append(self, op: Op) -> None:
        await self.submit(op)

    def problem(self) -> str | None:
        return None


class Tracker:
    """Everything the views share: config, guard, registry, core, documents, metrics."""

    def __init__(self, config: TrackerConfig, secret: bytes) -> None:
        self.config = config
        self.secret = secret
        self.guard = Guard(config, secret)
        self.registry = Registry(ban_seconds=config.ban_seconds,
                                 origin_fetchers=config.origin_fetchers,
                                 fetcher_stall_seconds=config.fetcher_stall_seconds,
                                 fetcher_start_seconds=config.fetcher_start)
        self.manifests = Documents(config.state_dir, "manifests", check_content_id,
                                   _check_manifest_file)
        self.names = Documents(config.state_dir, "names", names.check_file_key,
                               names.check_document)
        self.origins = Documents(config.state_dir, "origins", origins.check_key,
                                 origins.check_document)
        self.machine = Machine(self.registry, get_policy(config.handout_policy),
                               config.peer_ttl_seconds)
        seed = config.seed if config.seed is not None else int.from_bytes(os.urandom(8), "big")
        self.metrics = Metrics(self)
        self.core: Core = LocalCore(self.machine, random.Random(seed), self.expired)

    def expired(self, count: int) -> None:
        """`count` silent members were dropped (by either core)."""
        self.metrics.expired.inc(count)
        log.info("expired %d silent members", count)


TRACKER = web.AppKey("tracker", Tracker)
