"""What every view of the tracker shares: the `Tracker` at `app[TRACKER]`.

One `Tracker` per application holds the config, the request guard, the
registry of swarm members, the persisted documents (manifests and names), the
handout policy with its seeded rng, and the Prometheus metrics. The views
(tracker.app, tracker.content_views) find it with `request.app[TRACKER]`.

A manifest is stored in one canonical JSON spelling (`canonical`), so that the
same manifest published twice is the same bytes, and a file loaded from the
state dir is checked to hold the manifest its name says.
"""

from __future__ import annotations

import json
import os
import random
import time
from collections.abc import Callable

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge

from p2p.content import Manifest, check_content_id
from tracker import names
from tracker.config import TrackerConfig
from tracker.guard import Guard
from tracker.handout import get_policy
from tracker.registry import Registry
from tracker.store import Documents


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
