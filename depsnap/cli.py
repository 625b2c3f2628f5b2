"""`bootseer depsnap ...`: dependency snapshots, keyed by what produced them.

- `depsnap key --prefix DIR -- CMD ...`: print the key of installing with CMD
  into DIR, and every input that went into it (`--json`: one JSON line).
- `depsnap run --prefix DIR -- CMD ...`: if a snapshot for the key exists,
  restore it at DIR and skip CMD; else make a venv at DIR, run CMD in it,
  and if it succeeds publish the installed tree. Exits with CMD's status.
- `depsnap restore KEY --prefix DIR`: restore a published snapshot.
- `depsnap mount KEY DIR`: serve the snapshot read-only at DIR (FUSE),
  fetching only the files that are read; `depsnap umount DIR` ends it.

Expected failures (no agent, no tracker, no snapshot, an unsafe tree, a full
disk) are one line on stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from p2p.cli import cluster_secret
from p2p.errors import UserError


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `bootseer depsnap`."""
    p = sub.add_parser("depsnap", help="dependency snapshots: install once, restore anywhere",
                       description=__doc__.splitlines()[0])
    ds = p.add_subparsers(dest="depsnap_command", required=True, metavar="COMMAND")

    k = ds.add_parser("key", help="print a snapshot key and its inputs")
    _key_flags(k)
    k.set_defaults(run=_run_key)

    r = ds.add_parser("run", help="restore the key's snapshot, or install and publish it")
    _key_flags(r)
    node_flags(r)
    publish_flags(r)
    r.set_defaults(run=_run_run)

    s = ds.add_parser("restore", help="restore a published snapshot at --prefix")
    s.add_argument("key", metavar="KEY")
    s.add_argument("--prefix", type=Path, required=True)
    s.add_argument("--json", action="store_true", help="one JSON line")
    node_flags(s)
    s.set_defaults(run=_run_restore)

    from depsnap.mount import add_mount_commands

    add_mount_commands(ds, node_flags)


def env_path(name: str) -> Path | None:
    value = os.environ.get(name)
    return Path(value) if value else None


def _key_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--prefix", type=Path, required=True, help="the venv to install into")
    p.add_argument("--python", default="python3",
                   help="the interpreter the venv is made with (default: python3 on PATH)")
    p.add_argument("--base-image", default=os.environ.get("BOOTSEER_BASE_IMAGE", ""),
                   help="digest of the base image, when known (part of the key)")
    p.add_argument("--resolved", type=Path, action="append", default=[], metavar="FILE",
                   help="a resolved `name==version` list (lock file) that is part of the key")
    p.add_argument("--json", action="store_true", help="one JSON line")
    p.add_argument("install_command", nargs=argparse.REMAINDER, metavar="-- CMD ...")


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
    p.add_argument("--tracker", default=os.environ.get("BOOTSEER_TRACKER",
                                                       "http://127.0.0.1:7070"))
    p.add_argument("--api-socket", default=os.environ.get("BOOTSEER_API_SOCKET",
                                                          "/run/bootseer/agent.sock"))
    p.add_argument("--cache-dir", type=Path,
                   default=env_path("BOOTSEER_DEPSNAP_CACHE") or
                   Path.home() / ".cache" / "bootseer" / "depsnap-files",
                   help="hard-link cache of restored files (same filesystem as the prefix)")
    p.add_argument("--no-cache", action="store_true", help="do not use the hard-link cache")
    p.add_argument("--origin-url", default=os.environ.get("BOOTSEER_DEPSNAP_ORIGIN_URL"),
                   help="URL agents read --origin-dir at (default: file://DIR); where a "
                        "snapshot the tracker does not know is looked for")
    p.add_argument("--store-dir", type=Path,
                   default=Path(os.environ.get("BOOTSEER_STORE_DIR", "/var/cache/bootseer")),
                   help="the local agent's chunk store, read directly (the agent's API is used "
                        "for what is not there)")


def _command(args: argparse.Namespace) -> list[str]:
    given = args.install_command
    command: list[str] = given[1:] if given[:1] == ["--"] else given
    if not command:
        raise UserError("give the install command after --, e.g. -- pip install -r req.txt")
    return command


def _inputs(args: argparse.Namespace) -> Any:
    from depsnap.inputs import gather
    from depsnap.key import KeyInputError

    try:
        return gather(_command(args), args.prefix.absolute(), args.python, os.environ,
                      Path.cwd(), args.base_image, args.resolved)
    except KeyInputError as exc:
        raise UserError(str(exc)) from None


def places(args: argparse.Namespace, origin_dir: Path | None = None) -> Any:
    from depsnap.run import Places

    url = getattr(args, "origin_url", None) or (
        f"file://{origin_dir.absolute()}" if origin_dir else "")
    return Places(args.tracker, cluster_secret(), args.api_socket,
                  origin_dir.absolute() if origin_dir else None, url,
                  None if args.no_cache else args.cache_dir.absolute(),
                  args.store_dir.absolute(), getattr(args, "origin_registry", None))


def expected_errors() -> tuple[type[Exception], ...]:
    """Every failure a user can cause or fix: shown as one line, never a traceback."""
    from depsnap.capture import CaptureError
    from depsnap.key import KeyInputError
    from depsnap.publish import SnapshotNotFound
    from depsnap.record import KeyRecordError
    from depsnap.restore import RestoreError
    from depsnap.snapshot import SnapshotError
    from p2p.agentclient import AgentError
    from p2p.auth import AuthError
    from p2p.content import ManifestError
    from p2p.origin.base import OriginError
    from p2p.tracker_client import TrackerError, TrackerUnavailable

    return (CaptureError, KeyInputError, SnapshotNotFound, RestoreError, SnapshotError,
            AuthError, ManifestError, AgentError, TrackerError, TrackerUnavailable,
            OriginError, KeyRecordError, ValueError)


def expected(call: Any) -> Any:
    """Call `call()`; every expected failure becomes a UserError."""
    try:
        return call()
    except expected_errors() as exc:
        raise UserError(str(exc)) from None
    except OSError as exc:
        raise UserError(f"{exc.filename or ''}: {exc.strerror}") from None


def _show(summary: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(summary), flush=True)
    else:
        for key, value in summary.items():
            print(f"{key}: {value}", file=sys.stderr)


# ---- commands -----------------------------------------------------------------------------


def _run_key(args: argparse.Namespace) -> int:
    inputs = _inputs(args)
    if args.json:
        print(json.dumps({"key": inputs.key(), "inputs": inputs.describe()}))
    else:
        print(inputs.key())
        print(json.dumps(inputs.describe(), indent=2))
    return 0


def _run_run(args: argparse.Namespace) -> int:
    from depsnap.run import run

    inputs = _inputs(args)
    where = places(args, args.origin_dir)
    status, summary = expected(lambda: run(where, inputs, _command(args),
                                           args.prefix.absolute(), os.environ))
    _show(summary, args.json)
    return int(status)


def _run_restore(args: argparse.Namespace) -> int:
    from depsnap.key import check_key
    from depsnap.run import restore_key

    key = expected(lambda: check_key(args.key))
    where = places(args)
    summary = expected(lambda: asyncio.run(restore_key(where, key, args.prefix.absolute())))
    _show(summary, args.json)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m depsnap ...`: `bootseer depsnap ...` without the console script."""
    from p2p.cli import main as bootseer_main

    return bootseer_main(["depsnap", *(sys.argv[1:] if argv is None else argv)])
