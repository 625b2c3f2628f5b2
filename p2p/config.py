"""Agent configuration: documented defaults, then TOML, then environment, then flags.

`AgentConfig` is a frozen dataclass; every field has a default in units.
`load_agent_config(path, env, overrides)` applies, in order: the TOML file
(unknown keys are rejected, naming the key and the file), the environment
variables operators expect (`BOOTSEER_TRACKER`, `BOOTSEER_RACK`, ...), and
finally only the flags the user passed.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from p2p.bytepath import default_data_workers
from p2p.configfile import apply, read_toml
from p2p.swarm import SwarmConfig
from p2p.swarm.node import DEFAULT_LINE_BPS
from p2p.swarm.uploads import UPLOAD_ORDER, UPLOAD_ORDERS, UPLOAD_SLOTS
from p2p.units import GiB


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
    # Peers' chunk bytes received, hashed and written by data_workers threads, one call
    # per piece (p2p.bytepath), instead of read by the event loop and written by worker
    # threads. Off by default: on the 2-core test VM it cost more CPU per GiB (ab.py,
    # benchmarks/RESULTS.md, issue 31 third pass).
    byte_movers: bool = False
    data_workers: int = 0  # threads that receive, hash and write chunk bytes beside the
    #                        control loop (p2p.bytepath); 0: the cores the node can spare
    #                        (all but one, at least 1), at most 8
    max_connections: int = 1024  # peer connections, authenticating or not, at once
    max_handshakes: int = 64  # unauthenticated peer connections at once (8 per address)
    announce_interval_s: float = 2.0  # until the tracker says otherwise
    mirror: str | None = None  # HOST:PORT: serve a pull-through registry mirror (p2p.mirror)
    mirror_upstream: str | None = None  # registry URL for clients that name none (no ns=)
    swarm: SwarmConfig = field(default_factory=SwarmConfig)  # the [swarm] table: policies

    def __post_init__(self) -> None:
        if self.upload_order not in UPLOAD_ORDERS:
            raise ValueError(f"upload_order {self.upload_order!r} is not one of "
                             f"{', '.join(UPLOAD_ORDERS)}")
        if self.data_workers < 0:
            raise ValueError(f"data_workers must be 0 (as many as the cores allow) or more, "
                             f"got {self.data_workers}")
        if self.line_mbps is not None and not self.line_mbps > 0:
            raise ValueError(f"line_mbps must be positive, got {self.line_mbps}")

    @property
    def line_Bps(self) -> float:
        """The line rate our requests' due assumes (p2p.swarm.node.Node.due)."""
        rate = self.line_mbps or self.download_mbps
        return rate * 1e6 if rate else DEFAULT_LINE_BPS

    @property
    def data_threads(self) -> int:
        """The byte-moving threads to run: `data_workers`, or what the cores allow."""
        return self.data_workers or default_data_workers()

    @property
    def upload_Bps(self) -> float | None:
        """The upload cap in bytes/s; None for none."""
        return self.upload_mbps * 1e6 if self.upload_mbps else None

    @property
    def download_Bps(self) -> float | None:
        """The download cap in bytes/s; None for none."""
        return self.download_mbps * 1e6 if self.download_mbps else None

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
    """Defaults, then the TOML file at `path`, then the environment (ENV_KEYS), then
    `overrides` (the flags given): p2p.configfile checks every key of each."""
    config = AgentConfig()
    if path:
        config = apply(config, read_toml(path), f"config file {path}")
    env = os.environ if env is None else env
    from_env = {key: env[name] for name, key in ENV_KEYS.items() if env.get(name)}
    config = apply(config, from_env, "the environment", text=True)
    return apply(config, dict(overrides or {}), "the command line", text=True)
