"""`depsnap mount`: serve a snapshot read-only through fusefs, fetching only what is read.

The snapshot's tree manifest becomes a `fusefs.tree.Tree` (`snapshot_tree`):
each file is one extent, `(pack content, member offset, size)`, so a read of
a file is a read of a byte range of its pack's raw bytes. `depsnap.source`
turns that into reads of the zstd frames under it (decoded and cached) and
makes a file's first read prefetch the rest of that file; the pack's chunks
are fetched lazily through the agent (`fusefs.source.AgentSource`: chunks
already local are read from the agent's store files, missing ones are asked
of the agent, which fetches them from peers or the origin). Lookups, getattr,
readdir and readlink come from the tree in memory, with the kernel's entry
and attribute caching on (the tree never changes): Python's import system,
which stats thousands of names that do not exist, fetches nothing.

It follows the shape of image mounts (`fusefs.image.mount`): `serve_snapshot`
is the foreground serving process (`depsnap serve`, which must be a process of
its own: a process that reads a pyfuse3 mount it serves deadlocks), and
`depsnap mount` starts it detached with `fusefs.mount.start_detached`, waits
for its one JSON "mounted" line, prints it and leaves it running;
`depsnap umount DIR` ends it.

A venv works from the mount for `DIR/bin/python` (Python finds its prefix
from the `pyvenv.cfg` beside it); console scripts name the original prefix in
their shebang, so mount at the prefix the snapshot was made for when they
are to be run.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from depsnap.snapshot import Snapshot
from fusefs.cli import add_serving_flags, add_umount
from fusefs.tree import Entry, Extent, Kind, Layer, Tree, build_tree
from p2p.cli import UserError

log = logging.getLogger("bootseer.depsnap")
KINDS = {"dir": Kind.DIR, "file": Kind.FILE, "symlink": Kind.SYMLINK}


def snapshot_tree(snapshot: Snapshot, uid: int = 0, gid: int = 0) -> Tree:
    """The snapshot as a fusefs tree: one extent per file, into its pack."""
    where = snapshot.locations()
    entries = []
    for e in snapshot.entries:
        extents: tuple[Extent, ...] = ()
        if e.kind == "file":
            pack, member = where[e.digest]
            extents = (Extent(pack.content, member.offset, e.size),)
        entries.append(Entry(e.path, KINDS[e.kind], e.mode, uid, gid, e.mtime_ns, e.size,
                             extents, e.target))
    return build_tree([Layer(f"snapshot {snapshot.key}", entries)])


@dataclass(frozen=True, slots=True)
class MountOptions:
    key: str
    mountpoint: Path
    tracker: str
    api_socket: str
    store_dir: Path
    read_timeout_s: float = 30.0
    read_ahead_kb: int = 4096
    allow_other: bool = False

    def argv(self) -> list[str]:
        """The `depsnap serve` command line for these options."""
        return [sys.executable, "-m", "depsnap", "serve", self.key, str(self.mountpoint),
                "--tracker", self.tracker, "--api-socket", self.api_socket,
                "--store-dir", str(self.store_dir), "--read-timeout", str(self.read_timeout_s),
                "--read-ahead-kb", str(self.read_ahead_kb),
                *(["--allow-other"] if self.allow_other else [])]


async def serve_snapshot(opts: MountOptions, secret: bytes,
                         on_ready: Callable[[dict[str, Any]], None]) -> None:
    """Serve the snapshot of `opts.key` at `opts.mountpoint` until SIGTERM or unmount."""
    from depsnap.publish import load_snapshot
    from depsnap.source import SnapshotSource
    from fusefs.mount import serve
    from fusefs.source import AgentSource
    from p2p.agentclient import AgentClient
    from p2p.tracker_client import TrackerClient

    agent = AgentClient(opts.api_socket)
    try:
        async with TrackerClient(opts.tracker, secret) as tracker:
            tree_id, snapshot = await load_snapshot(tracker, agent, opts.key)
        tree = snapshot_tree(snapshot, os.getuid(), os.getgid())
    except BaseException:
        await agent.close()
        raise
    source = SnapshotSource(AgentSource(opts.store_dir, agent, opts.read_timeout_s),
                            snapshot)  # closing it closes the agent client

    def ready(info: dict[str, Any]) -> None:
        on_ready({**info, "key": opts.key, "tree": tree_id, "prefix": snapshot.prefix,
                  "files": len(tree),
                  "packs": [p.content for p in snapshot.packs]})

    await serve(tree, source, opts.mountpoint, opts.read_ahead_kb, opts.allow_other, ready)


# ---- commands -----------------------------------------------------------------------------


def add_mount_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser],
                       node_flags: Callable[[argparse.ArgumentParser], None]) -> None:
    for name, help_text, run in (("mount", "serve a snapshot read-only at DIR", _run_mount),
                                 ("serve", "serve a snapshot at DIR in the foreground",
                                  _run_serve)):
        m = sub.add_parser(name, help=help_text)
        m.add_argument("key", metavar="KEY")
        m.add_argument("mountpoint", metavar="DIR", type=Path)
        node_flags(m)
        add_serving_flags(m)
        m.add_argument("--log-level", default="WARNING", type=str.upper,
                       choices=["DEBUG", "INFO", "WARNING", "ERROR"])
        m.set_defaults(run=run)
    add_umount(sub, "a snapshot")


def _options(args: argparse.Namespace) -> MountOptions:
    from depsnap.cli import expected
    from depsnap.key import check_key

    if not args.mountpoint.is_dir():
        raise UserError(f"the mount point {args.mountpoint} is not a directory")
    if args.read_timeout_s <= 0 or args.read_ahead_kb <= 0:
        raise UserError("--read-timeout and --read-ahead-kb must be positive")
    return MountOptions(expected(lambda: check_key(args.key)), args.mountpoint.absolute(),
                        args.tracker, args.api_socket, args.store_dir.absolute(),
                        args.read_timeout_s, args.read_ahead_kb, args.allow_other)


def _run_serve(args: argparse.Namespace) -> int:
    import asyncio

    from depsnap.cli import expected, places
    from fusefs.mount import MountError, check_fuse, ready_line
    from fusefs.tree import TreeError

    logging.basicConfig(level=args.log_level, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    opts, secret = _options(args), places(args).secret
    try:
        check_fuse()
        expected(lambda: asyncio.run(serve_snapshot(opts, secret, ready_line)))
    except (MountError, TreeError) as exc:
        raise UserError(str(exc)) from None
    return 0



def _run_mount(args: argparse.Namespace) -> int:
    from depsnap.cli import places
    from fusefs.mount import MountError, start_detached

    opts = _options(args)
    places(args)  # the secret: fail here, not in the child
    log_path = Path(os.environ.get("BOOTSEER_LOG_DIR", tempfile.gettempdir())) / \
        f"bootseer-depsnap-{os.getpid()}.log"
    try:
        ready = start_detached(opts.argv(), log_path, opts.read_timeout_s + 60.0)
    except MountError as exc:
        raise UserError(str(exc)) from None
    print(json.dumps({**ready, "log": str(log_path)}))
    return 0
