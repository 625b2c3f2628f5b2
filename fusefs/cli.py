"""`bootseer fs mount TREE_FILE DIR`: serve a tree file over FUSE until SIGTERM or SIGINT.
`bootseer fs server --socket SOCKET`: the mount server (`fusefs.server`).

A development command: the tree file is the JSON form of a `fusefs.tree.Tree`
(`Tree.to_json`); file bytes come from the local agent's store directory and,
for chunks not yet local, from the agent's API socket. Once the mount serves,
the command prints exactly one JSON line on stdout,
`{"event": "mounted", "mountpoint": DIR, "read_ahead_kb": N}`. Logs go to
stderr. Expected failures (no FUSE, a bad tree file, a bad mount point) are
one-line errors, never tracebacks. Also runs as `python -m fusefs mount ...`.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from p2p.errors import UserError

log = logging.getLogger("bootseer.fusefs")


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `bootseer fs`."""
    p = sub.add_parser("fs", help="FUSE mounts of content trees (development)",
                       description="FUSE mounts of content trees")
    fs_sub = p.add_subparsers(dest="fs_command", required=True, metavar="COMMAND")
    add_mount(fs_sub)
    add_server(fs_sub)


def add_mount(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    m = sub.add_parser("mount", help="serve a tree file at DIR until SIGTERM",
                       description=__doc__.splitlines()[0])
    m.add_argument("tree_file", metavar="TREE_FILE", help="JSON tree (Tree.to_json)")
    m.add_argument("mountpoint", metavar="DIR", help="an existing empty directory")
    m.add_argument("--api-socket", dest="api_socket", required=True, metavar="PATH",
                   help="the local agent's API socket")
    m.add_argument("--store-dir", dest="store_dir", required=True, metavar="DIR",
                   help="the local agent's chunk store directory")
    add_serving_flags(m)
    add_passthrough_flag(m)
    m.add_argument("--no-open", dest="no_open", action="store_true",
                   help="no passthrough, and no OPEN round trip per file: the kernel-protocol "
                        "server asks the kernel to open files itself (for many small "
                        "files read once; Linux 6.9+ as root, elsewhere pyfuse3)")
    m.add_argument("--log-level", dest="log_level", default="INFO", type=str.upper,
                   choices=["DEBUG", "INFO", "WARNING", "ERROR"], help="stderr log level")
    m.set_defaults(run=run_mount, serving=mount_serving)


def add_server(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    s = sub.add_parser(
        "server", help="serve many mounts from one long-lived process",
        description="Listen at SOCKET and serve the mount of every mount command run with "
                    "BOOTSEER_MOUNT_SERVER=SOCKET (depsnap, image and ckpt mounts): "
                    "kernel-protocol mounts (Linux 6.9+ as root) in one host process, "
                    "served again by a new host if it dies; pyfuse3 mounts in processes "
                    "forked from this one, imports done (fusefs.server). Prints one JSON "
                    "line once it listens; runs until SIGTERM, which unmounts the host's "
                    "mounts (forked ones outlive it).")
    s.add_argument("--socket", required=True, type=Path, metavar="SOCKET",
                   help="the unix socket to listen at (made mode 0600)")
    s.add_argument("--log-level", dest="log_level", default="INFO", type=str.upper,
                   choices=["DEBUG", "INFO", "WARNING", "ERROR"], help="stderr log level")
    s.set_defaults(run=run_server)


def run_server(args: argparse.Namespace) -> int:
    from fusefs.mount import check_fuse
    from fusefs.server import serve_forever

    logging.basicConfig(level=args.log_level, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not args.socket.parent.is_dir():
        raise UserError(f"the directory of --socket {args.socket} does not exist")
    check_fuse()
    serve_forever(args.socket.absolute(), lambda info: print(json.dumps(info), flush=True))
    return 0


def add_passthrough_flag(p: argparse.ArgumentParser) -> None:
    """`--no-passthrough`, for the mounts whose whole, verified files the kernel can read
    itself (FUSE passthrough, Linux 6.9+ as root)."""
    p.add_argument("--no-passthrough", dest="passthrough", action="store_false",
                   help="serve every read through the handler (pyfuse3), even where the "
                   "kernel could read whole verified files itself")


def add_serving_flags(p: argparse.ArgumentParser) -> None:
    """The flags of every command that serves a mount: read deadline, read-ahead, and
    whether other users may read it."""
    p.add_argument("--read-timeout", dest="read_timeout_s", type=float, default=30.0,
                   metavar="SECONDS", help="a read not served within this fails with EIO "
                   "(default 30)")
    p.add_argument("--read-ahead-kb", dest="read_ahead_kb", type=int, default=4096,
                   metavar="KB", help="the mount's read-ahead; 1024 or more gives 1 MiB "
                   "reads (default 4096)")
    p.add_argument("--allow-other", dest="allow_other", action="store_true",
                   help="let other users read the mount (needs user_allow_other in "
                   "/etc/fuse.conf unless root)")


def add_summary_flag(p: argparse.ArgumentParser) -> None:
    """`--summary FILE`, for the `serve` commands: what the mount reports at its end, written
    there as JSON (`fusefs.mount.write_summary`; `image run` and `launch` read it)."""
    p.add_argument("--summary", type=Path, metavar="FILE",
                   help="write what the mount reports at its end here, as JSON (a new file)")


def add_umount(sub: argparse._SubParsersAction[argparse.ArgumentParser], what: str) -> None:
    """`umount DIR`, for the commands that mount `what` from a background process."""
    u = sub.add_parser("umount", help=f"unmount {what} mounted with `mount`")
    u.add_argument("mountpoint", metavar="DIR", type=Path)
    u.set_defaults(run=run_umount)


def run_umount(args: argparse.Namespace) -> int:
    from fusefs.mount import force_unmount
    from fusefs.mountinfo import is_mounted

    if not is_mounted(args.mountpoint):
        raise UserError(f"no FUSE mount at {args.mountpoint}")
    force_unmount(args.mountpoint)
    return 0


def run_mount(args: argparse.Namespace) -> int:
    from fusefs.mount import run_serving

    return run_serving(args)


def mount_serving(args: argparse.Namespace) -> Any:
    """`fs mount`'s `fusefs.mount.Serving`: the tree file read and the paths checked."""
    from fusefs.mount import MountError, Serving, check_fuse
    from fusefs.tree import Tree, TreeError

    try:
        check_fuse()
        tree = Tree.from_json(Path(args.tree_file).read_bytes(), args.tree_file)
    except (MountError, TreeError) as exc:
        raise UserError(str(exc)) from None
    except OSError as exc:
        raise UserError(f"cannot read the tree file {args.tree_file}: {exc.strerror}") from None
    _check_dir(args.mountpoint, "mount point")
    _check_dir(args.store_dir, "store directory")
    if args.read_timeout_s <= 0 or args.read_ahead_kb <= 0:
        raise UserError("--read-timeout and --read-ahead-kb must be positive")
    where, store = Path(args.mountpoint).absolute(), Path(args.store_dir).absolute()
    return Serving(lambda ready: _serve(tree, args, where, store, ready),
                   kernel=args.passthrough or args.no_open)


async def _serve(tree: Any, args: argparse.Namespace, where: Path, store: Path,
                 on_ready: Any) -> None:
    from fusefs.backing import WholeFiles
    from fusefs.mount import serve
    from fusefs.source import open_agent_source

    source = await open_agent_source(store, args.api_socket, args.read_timeout_s)

    def ready(info: dict[str, Any]) -> None:
        on_ready(info)
        log.info("serving %d nodes (%d bytes in files) at %s, read-ahead %s KiB",
                 len(tree), tree.total_bytes, info["mountpoint"], info["read_ahead_kb"])

    whole = WholeFiles(store) if args.passthrough and not args.no_open else None
    await serve(tree, source, where, args.read_ahead_kb, args.allow_other, ready,
                whole=whole, kernel=args.no_open)


def _check_dir(path: str, what: str) -> None:
    if not os.path.isdir(path):
        raise UserError(f"the {what} {path} is not a directory")


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m fusefs mount ...`: `bootseer fs ...` without the console script."""
    from p2p.cli import main as bootseer_main

    return bootseer_main(["fs", *(sys.argv[1:] if argv is None else argv)])
