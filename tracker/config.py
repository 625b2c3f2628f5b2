"""Tracker configuration: documented defaults, a TOML file, then command-line flags.

Precedence, lowest first: the defaults below, the keys of the TOML file given
with `--config` (top-level keys named exactly like the fields), then the flags
the user actually passed. Unknown keys and wrongly typed values are errors
that name the key and the file, so a typo never silently falls back to a
default. The cluster secret itself is never part of this config: it comes
from `BOOTSEER_SECRET`, `BOOTSEER_SECRET_FILE` or `secret_file`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from p2p.configfile import ConfigError, apply, read_toml
from tracker.handout import HANDOUT_POLICIES
from tracker.registry import ORIGIN_FETCHERS


@dataclass(frozen=True, slots=True)
class TrackerConfig:
    host: str = "127.0.0.1"  # address to listen on
    port: int = 7070  # TCP port; 0 picks a free one
    announce_interval_seconds: float = 2.0  # how often agents are told to announce
    peer_ttl_seconds: float = 10.0  # silence before a peer is dropped (~3 missed announces)
    handout_limit: int = 30  # most peers returned per announce
    handout_policy: str = "rack_aware"  # a name in tracker.handout.HANDOUT_POLICIES
    ban_seconds: float = 600.0  # how long a peer reported by 2 others gets no handouts
    origin_fetchers: int = ORIGIN_FETCHERS  # members per content appointed to fetch from the origin
    fetcher_stall_seconds: float = 10.0  # an incomplete fetcher this long without progress
    #                                      loses its origin slot to another member
    fetcher_start_seconds: float | None = None  # an appointed fetcher this long without its
    #                                             first progress loses its slot; None = 1.5
    #                                             announce intervals (its next announce shows it)
    state_dir: str | None = None  # where manifests persist across restarts; None = memory only
    secret_file: str | None = None  # cluster secret file; else BOOTSEER_SECRET(_FILE)
    seed: int | None = None  # handout rng seed, for reproducible runs; None = random
    max_connections: int = 4096  # open connections at once; beyond, a 503 and close
    header_timeout_seconds: float = 20.0  # to send a request head, from accept or last reply
    body_timeout_seconds: float = 20.0  # to send a request body, once the head is in
    announce_rate_per_second: float = 10.0  # announces per peer id, address and content
    announce_burst: int = 50  # announces allowed at once above that rate
    report_rate_per_second: float = 2.0  # reports per reporting address
    report_burst: int = 20  # reports allowed at once above that rate
    host_rate_per_second: float = 1000.0  # signed requests of any kind per address
    host_burst: int = 2000  # signed requests allowed at once above that rate
    replay_cache_entries: int = 1_000_000  # request MACs remembered to refuse replays
    redis_url: str | None = None  # replicas share state here (redis://HOST:PORT/DB); None =
    #                              one process, state in memory (tracker.replicas)
    redis_prefix: str = "bootseer"  # key prefix: one cluster per prefix on a Redis
    redis_password_file: str | None = None  # Redis AUTH password (required with redis_url)
    redis_username: str | None = None  # Redis ACL user; None = the default user
    redis_ca_file: str | None = None  # CA bundle that signs Redis's certificate (rediss://)
    log_level: str = "INFO"  # DEBUG, INFO, WARNING or ERROR

    @property
    def fetcher_start(self) -> float:
        """`fetcher_start_seconds`, or its default from the announce interval."""
        if self.fetcher_start_seconds is not None:
            return self.fetcher_start_seconds
        return FETCHER_START_INTERVALS * self.announce_interval_seconds

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"port {self.port} is outside 0..65535")
        if self.announce_interval_seconds <= 0:
            raise ConfigError("announce_interval_seconds must be > 0")
        if self.peer_ttl_seconds <= self.announce_interval_seconds:
            raise ConfigError(
                f"peer_ttl_seconds ({self.peer_ttl_seconds}) must exceed "
                f"announce_interval_seconds ({self.announce_interval_seconds}), "
                "or every peer expires between two announces"
            )
        if self.fetcher_start_seconds is not None and \
                not self.fetcher_start_seconds > self.announce_interval_seconds:
            raise ConfigError(
                f"fetcher_start_seconds ({self.fetcher_start_seconds}) must exceed "
                f"announce_interval_seconds ({self.announce_interval_seconds}): a fetcher "
                "shows its first progress at its next announce")
        if self.handout_limit < 1:
            raise ConfigError("handout_limit must be >= 1")
        if self.ban_seconds <= 0:
            raise ConfigError("ban_seconds must be > 0")
        if self.origin_fetchers < 1:
            raise ConfigError("origin_fetchers must be >= 1")
        for name in _POSITIVE:
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name} must be > 0")
        if self.handout_policy not in HANDOUT_POLICIES:
            known = ", ".join(sorted(HANDOUT_POLICIES))
            raise ConfigError(f"unknown handout_policy {self.handout_policy!r} (known: {known})")
        if self.redis_url is not None and not self.redis_url.startswith(REDIS_SCHEMES):
            raise ConfigError(f"redis_url {self.redis_url!r} must start with one of "
                              f"{', '.join(REDIS_SCHEMES)}")
        if self.redis_url is not None and self.redis_password_file is None:
            raise ConfigError("redis_url needs redis_password_file (--redis-password-file): "
                              "the replicas' Redis must require AUTH, as whoever can write "
                              "to it can change the swarm state (docs/trust.md)")
        if self.redis_ca_file is not None and not (self.redis_url or "").startswith(
                "rediss://"):
            raise ConfigError("redis_ca_file is for TLS: redis_url must start with rediss://")
        if not self.redis_prefix or any(c in self.redis_prefix for c in " {}"):
            raise ConfigError(f"redis_prefix {self.redis_prefix!r} must be non-empty, without "
                              "spaces or braces")
        if not isinstance(logging.getLevelName(self.log_level.upper()), int):
            raise ConfigError(f"unknown log_level {self.log_level!r}")


FETCHER_START_INTERVALS = 1.5
REDIS_SCHEMES = ("redis://", "rediss://", "unix://")

_POSITIVE = ("fetcher_stall_seconds", "max_connections", "header_timeout_seconds",
             "body_timeout_seconds", "announce_rate_per_second", "announce_burst",
             "report_rate_per_second", "report_burst", "host_rate_per_second", "host_burst",
             "replay_cache_entries")

def config_keys() -> list[str]:
    return [f.name for f in fields(TrackerConfig)]


def load_config(path: str | None, overrides: Mapping[str, Any]) -> TrackerConfig:
    """Defaults, then the TOML file at `path` (if any), then `overrides` (the flags passed):
    p2p.configfile checks every key of each."""
    config = TrackerConfig()
    if path:
        config = apply(config, read_toml(path), f"config file {path}")
    return apply(config, dict(overrides), "the command line", text=True)
