"""Agent configuration: documented defaults, then TOML, then environment, then flags.

`AgentConfig` is a frozen dataclass; every field has a default in units.
`load_agent_config(path, env, overrides)` applies, in order: the TOML file
(unknown keys are rejected, naming the key and the file), the environment
variables operators expect (`BOOTSEER_TRACKER`, `BOOTSEER_RACK`, ...), and
finally only the flags the user passed.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from p2p.swarm import SwarmConfig
from p2p.swarm.node import DEFAULT_LINE_BPS
from p2p.swarm.uploads import UPLOAD_ORDER, UPLOAD_ORDERS, UPLOAD_SLOTS
from p2p.units import GiB


class ConfigError(Exception):
    """The configuration is invalid; the message names the key and where it came from."""


@dataclass(frozen=True, slots=True)
class AgentConfig:
    tracker: str = "http://127.0.0.1:7070"  # tracker URL; replicas: several, comma-separated
    host: str = "127.0.0.1"  # where peers connect to us
    port: int = 7080  # 0 = pick a free port
    rack: str = "default"  # the node's rack: peers in it are preferred (rack_aware)
    peer_id: str = ""  # this node's id in the swarm; empty: hostname:port
    store_dir: str = "/var/cache/bootseer"  # verified chunks, kept across restarts
    store_budget_gb: float = 50.0  # the store's size cap (GiB); least recently used go first
    api_socket: str = "/run/bootseer/agent.sock"  # local API (Unix socket), mode 0660
    api_group: str | None = None  # group of the socket and its 0750 directory (readers)
    metrics_port: int | None = None  # also serve GET /metrics on host:metrics_port
    secret_file: str | None = None  # file with the cluster secret; else BOOTSEER_SECRET(_FILE)
    upload_mbps: float | None = None  # per-node cap on bytes served to peers (MB/s, 10^6 B/s)
    download_mbps: float | None = None  # per-node cap on bytes fetched, peers and origins (MB/s)
    origin_concurrency: int = 4  # concurrent reads per origin from this node
    upload_slots: int = UPLOAD_SLOTS  # pieces sent at once, over all peers
    upload_order: str = UPLOAD_ORDER  # which waiting piece gets a free slot: the one
    #                   for the peer furthest behind its line rate (p2p.swarm.uploads)
    line_mbps: float | None = None  # the rate our requests' due assumes (MB/s): default
    #                                 download_mbps if set, else 3125 (25 Gbit/s)
    max_connections: int = 1024  # peer connections, authenticating or not, at once
    max_handshakes: int = 64  # unauthenticated peer connections at once (8 per address)
    announce_interval_s: float = 2.0  # until the tracker says otherwise
    swarm: SwarmConfig = field(default_factory=SwarmConfig)  # the [swarm] table: policies

    def __post_init__(self) -> None:
        if self.upload_order not in UPLOAD_ORDERS:
            raise ValueError(f"upload_order {self.upload_order!r} is not one of "
                             f"{', '.join(UPLOAD_ORDERS)}")
        if self.line_mbps is not None and not self.line_mbps > 0:
            raise ValueError(f"line_mbps must be positive, got {self.line_mbps}")

    @property
    def line_Bps(self) -> float:
        """The line rate our requests' due assumes (p2p.swarm.node.Node.due)."""
        rate = self.line_mbps or self.download_mbps
        return rate * 1e6 if rate else DEFAULT_LINE_BPS

    @property
    def store_budget_bytes(self) -> int:
        return int(self.store_budget_gb * GiB)

    def resolved_peer_id(self, port: int) -> str:
        return self.peer_id or f"{socket.gethostname()}:{port}"


ENV_KEYS = {
    "BOOTSEER_TRACKER": "tracker",
    "BOOTSEER_RACK": "rack",
    "BOOTSEER_STORE_DIR": "store_dir",
    "BOOTSEER_API_SOCKET": "api_socket",
    "BOOTSEER_PEER_ID": "peer_id",
}


def load_agent_config(path: str | None, env: Mapping[str, str] | None = None,
                      overrides: Mapping[str, Any] | None = None) -> AgentConfig:
    config = AgentConfig()
    if path:
        config = _apply(config, _read_toml(path), source=path)
    env = os.environ if env is None else env
    from_env = {key: env[name] for name, key in ENV_KEYS.items() if env.get(name)}
    config = _apply(config, from_env, source="the environment")
    final: AgentConfig = _apply(config, dict(overrides or {}), source="the command line")
    return final


def _read_toml(path: str) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from exc


def _apply(config: Any, values: Mapping[str, Any], source: str, prefix: str = "") -> Any:
    known = {f.name: f for f in fields(config)}
    changes: dict[str, Any] = {}
    for key, value in values.items():
        if key not in known:
            raise ConfigError(f"unknown key {prefix}{key!r} in {source}; known keys: "
                              f"{', '.join(sorted(known))}")
        current = getattr(config, key)
        if dataclasses.is_dataclass(current):
            if not isinstance(value, Mapping):
                raise ConfigError(f"{prefix}{key} in {source} must be a table")
            changes[key] = _apply(current, value, source, prefix=f"{prefix}{key}.")
        else:
            changes[key] = _coerce(value, known[key].type, f"{prefix}{key}", source)
    try:
        return dataclasses.replace(config, **changes)
    except ValueError as exc:
        raise ConfigError(f"{exc} (from {source})") from exc


def _coerce(value: Any, annotation: Any, key: str, source: str) -> Any:
    kinds = str(annotation)
    try:
        if value is None:
            if "None" not in kinds:
                raise ValueError("may not be empty")
            return None
        if kinds.startswith("bool"):
            if isinstance(value, str):
                return value.lower() in {"1", "true", "yes", "on"}
            return bool(value)
        if kinds.startswith("int"):
            return int(value)
        if kinds.startswith("float"):
            number = float(value)
            if number < 0:
                raise ValueError("must not be negative")
            return number
        return str(value)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{key} in {source}: {value!r} is not valid ({exc})") from exc
