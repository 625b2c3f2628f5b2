"""Where a node's snapshot services are, from the command line: the flags every depsnap
command (and the launch's [env] part) takes, the `Places` they name, and the one place an
OSError of the user's files becomes a one-line error.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from p2p.auth import load_secret
from p2p.errors import UserError
from p2p.places import add_node_flags


def env_path(name: str) -> Path | None:
    value = os.environ.get(name)
    return Path(value) if value else None


def publish_flags(p: argparse.ArgumentParser) -> None:
    """Where a snapshot made here is published."""
    p.add_argument("--origin-dir", type=Path,
                   default=env_path("BOOTSEER_DEPSNAP_ORIGIN_DIR"),
                   help="directory new snapshots are written to (shared, or served with "
                        "`bootseer origin DIR`)")
    p.add_argument("--origin-registry", default=os.environ.get("BOOTSEER_DEPSNAP_REGISTRY"),
                   metavar="REPOSITORY", help="push new snapshots to this registry repository "
                   "(e.g. registry:5000/depsnap) instead of --origin-dir")


def node_flags(p: argparse.ArgumentParser) -> None:
    """Where this node's tracker, agent, store, cache and snapshot origin are."""
    add_node_flags(p)
    snapshot_flags(p)


def snapshot_flags(p: argparse.ArgumentParser) -> None:
    """Where restored files are cached, and where a snapshot the tracker does not know is."""
    p.add_argument("--cache-dir", type=Path,
                   default=env_path("BOOTSEER_DEPSNAP_CACHE") or
                   Path.home() / ".cache" / "bootseer" / "depsnap-files",
                   help="hard-link cache of restored files (same filesystem as the prefix)")
    p.add_argument("--no-cache", action="store_true", help="do not use the hard-link cache")
    p.add_argument("--origin-url", default=os.environ.get("BOOTSEER_DEPSNAP_ORIGIN_URL"),
                   help="URL agents read --origin-dir at (default: file://DIR); where a "
                        "snapshot the tracker does not know is looked for")


def places(args: argparse.Namespace, origin_dir: Path | None = None) -> Any:
    from depsnap.run import Places

    url = getattr(args, "origin_url", None) or (
        f"file://{origin_dir.absolute()}" if origin_dir else "")
    return Places(args.tracker, load_secret(), args.api_socket,
                  origin_dir.absolute() if origin_dir else None, url,
                  None if args.no_cache else args.cache_dir.absolute(),
                  args.store_dir.absolute(), getattr(args, "origin_registry", None))


def expected(call: Any) -> Any:
    """Call `call()`; an OSError (a file the user named, a full disk) becomes a UserError.
    Every other expected failure is a UserError already (p2p.errors)."""
    try:
        return call()
    except OSError as exc:
        raise UserError(f"{exc.filename or ''}: {exc.strerror}") from None
