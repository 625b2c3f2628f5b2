"""`bootseer ckpt ...`: HDFS checkpoints through the swarm.

- `ckpt prefetch URI...`: make every file under each URI local now (eagerly,
  through the agent: from peers first, HDFS for the rest, in stripes), with
  progress on a terminal; one JSON line per file.
- `ckpt mount URI DIR`: serve the URI (a file or a directory) read-only at DIR
  from a background process; prints one JSON line once it serves.
  `ckpt umount DIR` ends it.
- `ckpt serve URI DIR`: the foreground serving process behind mount.

URIs are `hdfs://HOST:PORT/path`, PORT the NameNode's HTTP (WebHDFS) port. The
first node to read a version of a file indexes it (see `hdfs_stripe.index`).
Expected failures (no agent, no tracker, HDFS errors, a file that changed) are
one line on stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fusefs.cli import add_passthrough_flag, add_serving_flags, add_summary_flag, add_umount
from p2p.auth import load_secret
from p2p.errors import UserError

log = logging.getLogger("bootseer.ckpt")


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `bootseer ckpt`."""
    p = sub.add_parser("ckpt", help="HDFS checkpoints, striped and shared by the swarm",
                       description=__doc__.splitlines()[0])
    ckpt_sub = p.add_subparsers(dest="ckpt_command", required=True, metavar="COMMAND")

    pf = ckpt_sub.add_parser("prefetch", help="make checkpoint files local now")
    pf.add_argument("uris", nargs="+", metavar="URI", help="hdfs://HOST:PORT/path")
    _common(pf)
    pf.add_argument("--json", action="store_true", help="no progress, only JSON lines")
    pf.set_defaults(run=_run_prefetch)

    for name, help_text, run in (("mount", "mount a checkpoint read-only at DIR", _run_mount),
                                 ("serve", "serve a checkpoint at DIR in the foreground",
                                  _run_serve)):
        m = ckpt_sub.add_parser(name, help=help_text)
        m.add_argument("uri", metavar="URI", help="hdfs://HOST:PORT/path (file or directory)")
        m.add_argument("mountpoint", metavar="DIR", type=Path)
        _common(m)
        add_serving_flags(m)
        add_passthrough_flag(m)
        m.set_defaults(run=run)
        if name == "serve":
            add_summary_flag(m)
            m.set_defaults(serving=_serving)

    add_umount(ckpt_sub, "a checkpoint")


def _common(p: argparse.ArgumentParser) -> None:
    env = os.environ.get
    p.add_argument("--tracker", default=env("BOOTSEER_TRACKER", "http://127.0.0.1:7070"))
    p.add_argument("--api-socket", default=env("BOOTSEER_API_SOCKET",
                                               "/run/bootseer/agent.sock"))
    p.add_argument("--store-dir", type=Path,
                   default=Path(env("BOOTSEER_STORE_DIR", "/var/cache/bootseer")),
                   help="the local agent's chunk store (read directly)")
    p.add_argument("--log-level", default="WARNING", type=str.upper,
                   choices=["DEBUG", "INFO", "WARNING", "ERROR"])


def _setup(args: argparse.Namespace) -> bytes:
    logging.basicConfig(level=args.log_level, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return load_secret()


def expected(run: Any) -> Any:
    """Run a coroutine. Its expected failures are UserErrors already (p2p.errors), which
    the dispatcher prints as one line."""
    return asyncio.run(run)


# ---- prefetch ---------------------------------------------------------------------------


def _run_prefetch(args: argparse.Namespace) -> int:
    from hdfs_stripe.naming import UriError, parse_uri

    secret = _setup(args)
    try:
        uris = [parse_uri(u) for u in args.uris]
    except UriError as exc:
        raise UserError(str(exc)) from None
    show = not args.json and sys.stderr.isatty()
    for line in expected(prefetch(uris, args.tracker, secret, args.api_socket,
                                  args.store_dir, show)):
        print(json.dumps(line), flush=True)
    return 0


async def prefetch(uris: Sequence[Any], tracker_url: str, secret: bytes, api_socket: str,
                   store_dir: Path | None, show_progress: bool = False) -> list[dict[str, Any]]:
    """Resolve every file under `uris` and make it local through the agent; per file, a
    summary (content id, whether this node indexed it, seconds, where bytes came from)."""
    from hdfs_stripe.mount import open_files
    from hdfs_stripe.origin import webhdfs_for
    from hdfs_stripe.reader import StripeReader
    from p2p.agentclient import AgentClient
    from p2p.tracker_client import TrackerClient

    lines = []
    async with TrackerClient(tracker_url, secret) as tracker, AgentClient(api_socket) as agent:
        for uri in uris:
            reader = StripeReader(webhdfs_for(uri))
            try:
                files = await open_files(reader, tracker, uri, store_dir, agent)
            finally:
                await reader.close()
            for f in files:
                started = time.monotonic()
                status = {}
                if f.resolved is not None:
                    status = await _ensure(agent, f.resolved.content_id,
                                           str(f.resolved.uri), show_progress)
                lines.append({
                    "uri": str(f.resolved.uri) if f.resolved else str(uri), "path": f.path,
                    "size": f.status.length,
                    "content": f.resolved.content_id if f.resolved else None,
                    "indexed": bool(f.resolved and f.resolved.indexed),
                    "index_hdfs_bytes": f.resolved.hdfs_bytes if f.resolved else 0,
                    "seconds": round(time.monotonic() - started, 3),
                    "origin_bytes": status.get("origin_bytes", 0),
                    "peer_bytes": status.get("peer_bytes", 0)})
    return lines


async def _ensure(agent: Any, content: str, label: str, show: bool) -> dict[str, Any]:
    from p2p.progress import while_fetching

    return dict(await while_fetching(agent, label, [content], agent.ensure(content), show=show))


# ---- mount ------------------------------------------------------------------------------


def _options(args: argparse.Namespace) -> Any:
    from hdfs_stripe.mount import MountOptions
    from hdfs_stripe.naming import UriError, parse_uri

    try:
        parse_uri(args.uri)
    except UriError as exc:
        raise UserError(str(exc)) from None
    if not args.mountpoint.is_dir():
        raise UserError(f"the mount point {args.mountpoint} is not a directory")
    if args.read_timeout_s <= 0 or args.read_ahead_kb <= 0:
        raise UserError("--read-timeout and --read-ahead-kb must be positive")
    return MountOptions(args.uri, args.mountpoint.absolute(), args.tracker, args.api_socket,
                        args.store_dir.absolute(), args.read_timeout_s, args.read_ahead_kb,
                        args.allow_other, args.passthrough, getattr(args, "summary", None))


def _run_serve(args: argparse.Namespace) -> int:
    from fusefs.mount import run_serving

    return run_serving(args)


def _serving(args: argparse.Namespace) -> Any:
    """`ckpt serve`'s `fusefs.mount.Serving`."""
    from fusefs.mount import Serving, check_fuse, write_summary
    from hdfs_stripe.mount import serve_ckpt

    secret, opts, env = load_secret(), _options(args), dict(os.environ)
    check_fuse()
    return Serving(lambda ready: serve_ckpt(opts, secret, ready, env), kernel=opts.passthrough,
                   finish=lambda summary: write_summary(opts.summary, summary))


def _run_mount(args: argparse.Namespace) -> int:
    from fusefs.mount import MountError, mount_log, start_detached
    from hdfs_stripe.mount import READY_SLACK_S

    _setup(args)
    opts = _options(args)
    log_path = mount_log("ckpt")
    try:
        ready = start_detached(opts.argv(), log_path, opts.read_timeout_s + READY_SLACK_S)
    except MountError as exc:
        raise UserError(str(exc)) from None
    print(json.dumps({**ready, "log": str(log_path)}))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m hdfs_stripe ...`: `bootseer ckpt ...` without the console script."""
    from p2p.cli import main as bootseer_main

    return bootseer_main(["ckpt", *(sys.argv[1:] if argv is None else argv)])
