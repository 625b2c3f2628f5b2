"""`bootseer image ...`: index, mount, run and pull container images through the swarm.

- `image index REF`: once per image (push rights needed): index every layer and
  publish it to the tracker (see `catalog`).
- `image mount REF DIR`: serve the image read-only at DIR from a background
  process; prints one JSON line once it serves. `image umount DIR` ends it.
- `image run [OPTIONS] REF [--] [CMD ...]`: mount, run CMD (or the image's command) in the
  image under runc or bubblewrap with a writable tmpfs layer on top, unmount;
  exits with CMD's status. `--record` stores which blocks the launch touched,
  so the next launch (on any node) prefetches exactly those.
- `image pull REF`: fetch every layer into the local store now.
- `image serve REF DIR`: the foreground serving process behind mount and run.

Expected failures (no agent, no tracker, registry errors, an image not
indexed, a bad layer) are one line on stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fusefs.cli import add_passthrough_flag, add_serving_flags, add_summary_flag, add_umount
from p2p.auth import load_secret
from p2p.errors import UserError

log = logging.getLogger("bootseer.image")


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `bootseer image`."""
    p = sub.add_parser("image", help="container images, lazily, from the swarm",
                       description=__doc__.splitlines()[0])
    image_sub = p.add_subparsers(dest="image_command", required=True, metavar="COMMAND")

    i = image_sub.add_parser("index", help="index an image's layers once (needs push rights)")
    _common(i)
    i.add_argument("--digest", choices=("xxh3-128", "blake3"), default="xxh3-128",
                   help="chunk digest of the layer contents (blake3: for clusters that do "
                        "not trust every node)")
    i.add_argument("--json", action="store_true", help="one JSON line per layer")
    i.set_defaults(run=_run_index)

    for name, help_text, run in (("mount", "mount an image read-only at DIR", _run_mount),
                                 ("serve", "serve an image at DIR in the foreground",
                                  _run_serve)):
        m = image_sub.add_parser(name, help=help_text)
        _common(m)
        m.add_argument("mountpoint", metavar="DIR", type=Path)
        _mount_flags(m)
        m.set_defaults(run=run)
        if name == "serve":
            add_summary_flag(m)
            m.set_defaults(serving=_serving)

    add_umount(image_sub, "an image")

    r = image_sub.add_parser("run", help="run a command in an image; exits with its status")
    _common(r)
    _mount_flags(r)
    r.add_argument("--runtime", choices=("runc", "bwrap"), default="runc")
    r.add_argument("--json", action="store_true", help="print the launch timeline as JSON")
    r.add_argument("cmd", nargs=argparse.REMAINDER, metavar="CMD",
                   help="the command and its arguments, after REF (options go before REF, "
                        "as with docker run); default: the image's entrypoint and cmd")
    r.set_defaults(run=_run_run)

    pl = image_sub.add_parser("pull", help="fetch every layer into the local store now")
    _common(pl)
    pl.add_argument("--json", action="store_true", help="only the final JSON line")
    pl.set_defaults(run=_run_pull)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("ref", metavar="REF", help="image reference, e.g. registry:5000/repo:tag")
    p.add_argument("--tracker", default=os.environ.get("BOOTSEER_TRACKER",
                                                       "http://127.0.0.1:7070"))
    p.add_argument("--api-socket", default=os.environ.get("BOOTSEER_API_SOCKET",
                                                          "/run/bootseer/agent.sock"))
    p.add_argument("--store-dir", type=Path,
                   default=Path(os.environ.get("BOOTSEER_STORE_DIR", "/var/cache/bootseer")),
                   help="the local agent's chunk store (read directly by the mount)")
    p.add_argument("--plain-http", action="store_true",
                   help="talk plain HTTP to the registry (loopback registries always do)")
    p.add_argument("--log-level", default="WARNING", type=str.upper,
                   choices=["DEBUG", "INFO", "WARNING", "ERROR"])


def _mount_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--record", action="store_true",
                   help="record the blocks this launch touches for the next launches")
    p.add_argument("--record-missing", action="store_true",
                   help="record this launch if the image has no hot-block record yet")
    p.add_argument("--window", dest="window_s", type=float, default=60.0, metavar="SECONDS",
                   help="record only the first SECONDS of the launch (default 60)")
    p.add_argument("--no-prefetch", dest="prefetch", action="store_false",
                   help="ignore the image's hot-block record")
    add_serving_flags(p)
    add_passthrough_flag(p)


def _setup(args: argparse.Namespace) -> None:
    logging.basicConfig(level=args.log_level, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def _ref(text: str) -> Any:
    from fusefs.image.options import image_ref

    return image_ref(text)


def _options(args: argparse.Namespace, mountpoint: Path | None = None) -> Any:
    from fusefs.image.options import MountOptions

    if args.read_timeout_s <= 0 or args.read_ahead_kb <= 0 or args.window_s <= 0:
        raise UserError("--read-timeout, --read-ahead-kb and --window must be positive")
    return MountOptions(args.ref, (mountpoint or args.mountpoint).absolute(), args.tracker,
                        args.api_socket, args.store_dir.absolute(), args.plain_http,
                        args.record, args.window_s, args.prefetch, args.read_timeout_s,
                        args.read_ahead_kb, args.allow_other, args.record_missing,
                        args.passthrough, getattr(args, "summary", None))


def _expected(run: Any) -> Any:
    """Run a coroutine, or call `run` if it is callable. Its expected failures are
    UserErrors already (p2p.errors), which the dispatcher prints as one line."""
    return run() if callable(run) else asyncio.run(run)


# ---- commands ------------------------------------------------------------------------


def _run_index(args: argparse.Namespace) -> int:
    from fusefs.image.catalog import index_image
    from p2p.origin.oci import RegistryClient
    from p2p.tracker_client import TrackerClient

    _setup(args)
    ref, secret = _ref(args.ref), load_secret()

    def show(summary: dict[str, Any]) -> None:
        if args.json:
            print(json.dumps(summary), flush=True)
        else:
            state = "indexed" if summary["new"] else "already indexed"
            print(f"{summary['layer']}: {state} as {summary['content']}", flush=True)

    async def index() -> None:
        plain = (ref.registry,) if args.plain_http else ()
        async with RegistryClient(plain_http=plain) as registry, \
                TrackerClient(args.tracker, secret) as tracker:
            await index_image(registry, tracker, ref, plain_http=args.plain_http,
                              digest=args.digest, progress=show)

    _expected(index())
    return 0


def _run_serve(args: argparse.Namespace) -> int:
    from fusefs.mount import run_serving

    return run_serving(args)


def _serving(args: argparse.Namespace) -> Any:
    """`image serve`'s `fusefs.mount.Serving`."""
    from fusefs.image.mount import serve_image
    from fusefs.mount import Serving, check_fuse

    if not args.mountpoint.is_dir():
        raise UserError(f"the mount point {args.mountpoint} is not a directory")
    ref, secret, opts = _ref(args.ref), load_secret(), _options(args)
    _expected_sync(check_fuse)
    return Serving(lambda ready: serve_image(opts, secret, ref, ready),
                   kernel=opts.passthrough,
                   finish=lambda summary: _finish(opts.summary, summary))


def _finish(path: Path | None, summary: dict[str, Any]) -> None:
    """Log what the mount reports at its end, and write it to `path` (--summary)."""
    from fusefs.mount import write_summary

    log.info("done: %s", json.dumps(summary))
    write_summary(path, summary)


def _run_mount(args: argparse.Namespace) -> int:
    from fusefs.mount import check_fuse, mount_log, start_detached

    if not args.mountpoint.is_dir():
        raise UserError(f"the mount point {args.mountpoint} is not a directory")
    _ref(args.ref)
    load_secret()  # fail here, not inside the serving process
    _expected_sync(check_fuse)
    opts = _options(args)
    log_path = mount_log("image")
    ready = _expected(lambda: start_detached(opts.argv(), log_path,
                                             opts.read_timeout_s + 60.0))
    ready.pop("config", None)
    print(json.dumps({**ready, "log": str(log_path)}))
    return 0


def _expected_sync(check: Any) -> None:
    from fusefs.mount import MountError

    try:
        check()
    except MountError as exc:
        raise UserError(str(exc)) from None


def _run_run(args: argparse.Namespace) -> int:
    from fusefs.image.run import launch

    _setup(args)
    secret = load_secret()  # the reference is parsed where the mount is served
    opts = _options(args, Path("/"))
    command = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    status, timeline = _expected(lambda: launch(opts, secret, command or None,
                                                args.runtime, (UserError,)))
    if args.json:
        print(json.dumps({"exit_status": status, **timeline}))
        return int(status)
    if args.record or args.record_missing:
        sys.stderr.write(_record_line(args, timeline["record"]))
    if sys.stderr.isatty():
        sys.stderr.write(f"bootseer image run: {args.ref}: mounted in {timeline['mounted_s']} s; "
                         f"this run fetched {(timeline['peer_bytes'] or 0) / 1e6:,.1f} MB of "
                         f"it from peers and {(timeline['origin_bytes'] or 0) / 1e6:,.1f} MB "
                         "from the "
                         f"registry; {timeline['prefetch_chunks']} chunks were prefetched\n")
    return int(status)


def _record_line(args: argparse.Namespace, record: dict[str, Any]) -> str:
    """What became of the hot-block record `--record` (or `--record-missing`) asked for."""
    said = f"bootseer image run: {args.ref}:"
    if "record_error" in record:
        return f"{said} the hot-block record was not saved: {record['record_error']}\n"
    if "recorded_chunks" in record:
        return (f"{said} saved the hot-block record ({record['recorded_chunks']} chunks read "
                f"in this launch's first {args.window_s:g} s; it now holds "
                f"{record['record_chunks']} chunks from {record['record_runs']} launches)\n")
    if record.get("recording"):
        return (f"{said} no hot-block record saved: the command read nothing from the "
                f"image in its first {args.window_s:g} s\n")
    return f"{said} the image has a hot-block record already; this launch used it\n"


def _run_pull(args: argparse.Namespace) -> int:
    from fusefs.image.pull import pull_image

    _setup(args)
    ref, secret = _ref(args.ref), load_secret()
    result = _expected(pull_image(ref, args, secret, quiet=args.json))
    print(json.dumps(result))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m fusefs.image ...`: `bootseer image ...` without the console script."""
    from p2p.cli import main as bootseer_main

    return bootseer_main(["image", *(sys.argv[1:] if argv is None else argv)])
