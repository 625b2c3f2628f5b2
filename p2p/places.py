"""Where a node's services and files are: its tracker, its agent's local API, its chunk
store, and the cluster secret; with the flags (and environment variables) every command
that talks to a node's agent takes them from.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path

DEFAULT_TRACKER = "http://127.0.0.1:7070"
DEFAULT_API_SOCKET = "/run/bootseer/agent.sock"
DEFAULT_STORE_DIR = "/var/cache/bootseer"


@dataclass(frozen=True, slots=True)
class NodePlaces:
    tracker: str  # the tracker's URL
    secret: bytes  # the cluster secret
    api_socket: str  # the local agent's API (a Unix socket)
    store_dir: Path | None  # the agent's chunk store, read directly when given


def add_node_flags(p: argparse.ArgumentParser) -> None:
    """--tracker, --api-socket and --store-dir, defaulting to BOOTSEER_TRACKER,
    BOOTSEER_API_SOCKET and BOOTSEER_STORE_DIR."""
    p.add_argument("--tracker", default=os.environ.get("BOOTSEER_TRACKER", DEFAULT_TRACKER),
                   help="the tracker's URL (default: $BOOTSEER_TRACKER or %(default)s)")
    p.add_argument("--api-socket",
                   default=os.environ.get("BOOTSEER_API_SOCKET", DEFAULT_API_SOCKET),
                   help="the local agent's API socket (default: %(default)s)")
    p.add_argument("--store-dir", type=Path,
                   default=Path(os.environ.get("BOOTSEER_STORE_DIR", DEFAULT_STORE_DIR)),
                   help="the local agent's chunk store, read directly (the agent's API is "
                        "used for what is not there; default: %(default)s)")


def node_places(args: argparse.Namespace, secret: bytes) -> NodePlaces:
    return NodePlaces(args.tracker, secret, args.api_socket, args.store_dir.absolute())
