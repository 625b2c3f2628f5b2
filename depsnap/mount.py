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

Hot frames (`depsnap.hot`). The mount reads the key's hot-frame record at
the origin (`--origin-url`) while it loads the tree and, if there is one,
hands the agent the chunks under the recorded frames as prefetch lists
before it builds its tree: the agent fetches them from peers, in the order
the recorded mounts first read them, while this process starts, so the
first import finds them local. With `--record missing` (the default) a
mount of a key that has no record yet records one; `always` records and
merges in every mount's run, `never` does not. A recording keeps the first
`--record-window` seconds of reads and is saved into `--origin-dir` when
the window ends or at unmount, whichever comes first. No record, an
unreadable or hostile one, or an origin directory that cannot be written:
a warning, and the mount serves on demand as before.

A venv works from the mount for `DIR/bin/python` (Python finds its prefix
from the `pyvenv.cfg` beside it); console scripts name the original prefix in
their shebang, so mount at the prefix the snapshot was made for when they
are to be run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from depsnap.mounttree import open_tree, snapshot_tree
from depsnap.snapshot import Snapshot
from fusefs.cli import add_serving_flags, add_summary_flag, add_umount
from fusefs.record import WINDOW_S, Recorder, RecordError
from fusefs.tree import Tree
from p2p.errors import UserError

if TYPE_CHECKING:  # the serving process loads these; the CLI's parser need not
    from depsnap.backing import MemberFiles
    from depsnap.hot import Frame, HotRecord
    from depsnap.source import SnapshotSource

log = logging.getLogger("bootseer.depsnap")
RECORD_MODES = ("missing", "always", "never")
SERVERS = ("kernel", "pyfuse3")
HOT_TIMEOUT_S = 5.0  # how long a mount waits for its hot-frame record


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
    origin_url: str = ""  # where the key's hot-frame record is read ("": none)
    origin_dir: Path | None = None  # where a recorded one is written (None: not recorded)
    record: str = "missing"  # RECORD_MODES
    record_window_s: float = WINDOW_S
    prefetch: bool = True  # prefetch the recorded frames' chunks
    passthrough: bool = False  # files with a decoded copy read by the kernel (depsnap.backing)
    server: str = "kernel"  # SERVERS: who answers the kernel's requests
    summary: Path | None = None  # where the serving writes what it reports at its end

    def argv(self) -> list[str]:
        """The `depsnap serve` command line for these options."""
        return [sys.executable, "-m", "depsnap", "serve", self.key, str(self.mountpoint),
                "--tracker", self.tracker, "--api-socket", self.api_socket,
                "--store-dir", str(self.store_dir), "--read-timeout", str(self.read_timeout_s),
                "--read-ahead-kb", str(self.read_ahead_kb), "--record", self.record,
                "--record-window", str(self.record_window_s),
                "--log-level", "INFO",  # its stderr is the mount's log file
                *(["--origin-url", self.origin_url] if self.origin_url else []),
                *(["--origin-dir", str(self.origin_dir)] if self.origin_dir else []),
                *(["--no-prefetch"] if not self.prefetch else []),
                *(["--passthrough"] if self.passthrough else []), "--server", self.server,
                *(["--allow-other"] if self.allow_other else []),
                *(["--summary", str(self.summary)] if self.summary else [])]


async def serve_snapshot(opts: MountOptions, secret: bytes,
                         on_ready: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """Serve the snapshot of `opts.key` at `opts.mountpoint` until SIGTERM or unmount;
    what was prefetched and recorded."""
    from depsnap.publish import load_packed_tree, load_snapshot
    from depsnap.source import SnapshotSource
    from fusefs.mount import serve
    from fusefs.source import AgentSource
    from p2p.agentclient import AgentClient
    from p2p.tracker_client import TrackerClient

    started = time.monotonic()
    agent = AgentClient(opts.api_socket)
    reading = asyncio.create_task(_read_hot(opts))  # beside the tree: both from afar
    prefetching: asyncio.Task[int] | None = None
    try:
        async with TrackerClient(opts.tracker, secret) as tracker:
            tree_id, snapshot = await load_snapshot(tracker, agent, opts.key, opts.origin_url)
            hot = _hot_frames(await reading, snapshot)
            recorder = _recorder(opts, hot is not None, started)
            source = SnapshotSource(AgentSource(opts.store_dir, agent, opts.read_timeout_s),
                                    snapshot, recorder)  # closing it closes the agent client
            # The prefetch's round trips to the agent (0.2-0.3 s here) go on while the tree
            # is read, and while the mount starts: nothing here waits for them.
            prefetching = asyncio.create_task(_prefetch(source, hot if opts.prefetch else None))
            packed = await load_packed_tree(tracker, agent, snapshot)
        loaded = time.monotonic()
        tree = (open_tree(snapshot, packed, os.getuid(), os.getgid()) if packed is not None
                else await asyncio.to_thread(snapshot_tree, snapshot, os.getuid(), os.getgid()))
        built = time.monotonic()
    except BaseException:
        reading.cancel()
        if prefetching is not None:
            prefetching.cancel()
            await asyncio.gather(prefetching, return_exceptions=True)
        await agent.close()
        raise
    saver = _Saver(opts, snapshot, recorder)
    copies = _copies(opts, snapshot, source, recorder)

    def ready(info: dict[str, Any]) -> None:
        on_ready({**info, "key": opts.key, "tree": tree_id, "prefix": snapshot.prefix,
                  "files": len(tree), "packs": [p.content for p in snapshot.packs],
                  "hot_frames": len(hot or ()), "prefetch_chunks": _queued(prefetching),
                  "recording": recorder is not None,
                  "tree_kind": "built" if isinstance(tree, Tree) else "packed",
                  "phases": {"load_s": round(loaded - started, 3),
                             "tree_s": round(built - loaded, 3),
                             "mount_s": round(time.monotonic() - built, 3)}})

    # Not a TaskGroup: it would wrap serve's own errors (MountError, ...) in a group.
    window = asyncio.create_task(saver.at_window_end())
    warming = asyncio.create_task(copies.warm(hot)) if copies is not None and hot else None
    try:
        await serve(tree, source, opts.mountpoint, opts.read_ahead_kb, opts.allow_other,
                    ready, whole=copies, kernel=opts.server == "kernel")
    finally:
        for task in (warming, prefetching):
            if task is not None and not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        saver.unmounted()
        await window  # at once, or when a save the window's end began is written
        await saver.save()
    return {"key": opts.key, "prefetch_chunks": _queued(prefetching), **source.account(),
            **saver.summary}


def _copies(opts: MountOptions, snapshot: Snapshot, source: SnapshotSource,
            recorder: Recorder | None) -> MemberFiles | None:
    """Decoded copies for passthrough (`depsnap.backing`), with `--passthrough`; none while
    recording, since the kernel's own reads of a copy would not be seen."""
    if not opts.passthrough or recorder is not None:
        return None
    from depsnap.backing import MemberFiles

    return MemberFiles(opts.store_dir, snapshot, source)


def _queued(prefetching: asyncio.Task[int]) -> int | None:
    """The chunks the prefetch asked for, once it has (None while it is still asking, or
    if it never finished)."""
    if not prefetching.done() or prefetching.cancelled() or prefetching.exception():
        return None
    return prefetching.result()


async def _prefetch(source: SnapshotSource, hot: list[Frame] | None) -> int:
    """Hand the agent the recorded frames' chunks; the chunks asked for. A failure here
    only loses the head start: reads fetch on demand."""
    from fusefs.source import SourceError
    from p2p.agentclient import AgentError

    if not hot:
        return 0
    try:
        queued = await source.prefetch_hot(hot)
    except (SourceError, AgentError) as exc:
        log.warning("the recorded frames were not prefetched (reads fetch on demand): %s", exc)
        return 0
    return queued


async def _read_hot(opts: MountOptions) -> HotRecord | None:
    """The key's record, if it comes within HOT_TIMEOUT_S: a hint does not hold up a mount."""
    from depsnap.hot import load_hot

    if not opts.origin_url or not (opts.prefetch or opts.record == "missing"):
        return None
    try:
        async with asyncio.timeout(HOT_TIMEOUT_S):
            return await load_hot(opts.origin_url, opts.key)
    except TimeoutError:
        log.warning("the hot-frame record of key %s did not come from %s within %g s; "
                    "not using it", opts.key, opts.origin_url, HOT_TIMEOUT_S)
        return None


def _hot_frames(record: HotRecord | None, snapshot: Snapshot) -> list[Frame] | None:
    """The record's frames, checked against the snapshot; None without a usable record."""
    from depsnap.hot import frames_of

    if record is None:
        log.info("no hot-frame record for key %s: everything loads on demand", snapshot.key)
        return None
    try:
        return frames_of(record, snapshot)
    except RecordError as exc:
        log.warning("ignoring the hot-frame record of key %s: %s", snapshot.key, exc)
        return None


def _recorder(opts: MountOptions, have_record: bool, started: float) -> Recorder | None:
    wanted = opts.record == "always" or (opts.record == "missing" and not have_record)
    if not wanted:
        return None
    if opts.origin_dir is None:
        log.info("not recording hot frames: no --origin-dir to save them in")
        return None
    from depsnap.hot import HotRecord

    return Recorder(HotRecord, opts.key, started, opts.record_window_s)


class _Saver:
    """Saves a recording once: when its window ends, or at unmount if that comes first."""

    def __init__(self, opts: MountOptions, snapshot: Snapshot, recorder: Recorder | None
                 ) -> None:
        self.opts, self.snapshot, self.recorder = opts, snapshot, recorder
        self.summary: dict[str, Any] = {}
        self._unmounted = asyncio.Event()

    async def at_window_end(self) -> None:
        if self.recorder is None:
            return
        try:
            await asyncio.wait_for(self._unmounted.wait(), self.recorder.window_s)
        except TimeoutError:
            await self.save()

    def unmounted(self) -> None:
        self._unmounted.set()

    async def save(self) -> None:
        recorder, self.recorder = self.recorder, None
        if recorder is None or not len(recorder) or self.opts.origin_dir is None:
            return
        from depsnap.hot import HotRecord, save_hot

        record = recorder.record()
        assert isinstance(record, HotRecord)
        try:  # a record is a hint: losing one loses no data
            merged = await asyncio.to_thread(save_hot, self.opts.origin_dir, record,
                                             self.snapshot)
        except OSError as exc:
            log.warning("the hot-frame record of this mount was not saved in %s: %s",
                        self.opts.origin_dir, exc)
            return
        self.summary = {"recorded_frames": len(recorder), "record_runs": merged.runs,
                        "record_frames": len(merged.times)}
        log.info("recorded %d frames of key %s; the record now has %d from %d mounts",
                 len(recorder), self.opts.key, len(merged.times), merged.runs)


# ---- commands -----------------------------------------------------------------------------


def add_mount_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser],
                       node_flags: Callable[[argparse.ArgumentParser], None]) -> None:
    from depsnap.places import env_path

    for name, help_text, run in (("mount", "serve a snapshot read-only at DIR", _run_mount),
                                 ("serve", "serve a snapshot at DIR in the foreground",
                                  _run_serve)):
        m = sub.add_parser(name, help=help_text)
        m.add_argument("key", metavar="KEY")
        m.add_argument("mountpoint", metavar="DIR", type=Path)
        node_flags(m)
        add_serving_flags(m)
        m.add_argument("--passthrough", action="store_true",
                       help="have the kernel read the bigger files from decoded, checked "
                            "copies in the store (FUSE passthrough, Linux 6.9+ as root): "
                            "written at a file's first open, and ahead of it for the files "
                            "of a hot-frame record; the copies cost CPU on the node's first "
                            "mount of a key and pay on later ones (benchmarks/RESULTS.md)")
        m.add_argument("--server", choices=SERVERS, default="kernel",
                       help="kernel (default): the kernel protocol spoken by this process, "
                            "with no OPEN, RELEASE or FLUSH round trips and listings that "
                            "spare lookups (Linux 6.9+ as root; elsewhere pyfuse3, as if "
                            "asked for); pyfuse3: libfuse's, every open a round trip "
                            "(benchmarks/RESULTS.md, issue 32, third pass)")
        m.add_argument("--origin-dir", type=Path, default=env_path("BOOTSEER_DEPSNAP_ORIGIN_DIR"),
                       help="the snapshot origin directory, where a recorded hot-frame "
                            "record is saved (default: $BOOTSEER_DEPSNAP_ORIGIN_DIR)")
        m.add_argument("--record", choices=RECORD_MODES, default="missing",
                       help="record the frames this mount reads first for later mounts: "
                            "if the key has no record yet (default), always, or never")
        m.add_argument("--record-window", dest="record_window_s", type=float,
                       default=WINDOW_S, metavar="SECONDS",
                       help=f"record only the first SECONDS of reads (default {WINDOW_S:g})")
        m.add_argument("--no-prefetch", dest="prefetch", action="store_false",
                       help="ignore the key's hot-frame record")
        m.add_argument("--log-level", default="WARNING", type=str.upper,
                       choices=["DEBUG", "INFO", "WARNING", "ERROR"])
        m.set_defaults(run=run)
        if name == "serve":
            add_summary_flag(m)
            m.set_defaults(serving=_serving)
    add_umount(sub, "a snapshot")


def _options(args: argparse.Namespace) -> MountOptions:
    from depsnap.key import check_key
    from depsnap.places import expected

    if not args.mountpoint.is_dir():
        raise UserError(f"the mount point {args.mountpoint} is not a directory")
    if args.read_timeout_s <= 0 or args.read_ahead_kb <= 0 or args.record_window_s <= 0:
        raise UserError("--read-timeout, --read-ahead-kb and --record-window must be positive")
    origin_dir = args.origin_dir.absolute() if args.origin_dir else None
    if args.record == "always" and origin_dir is None:
        raise UserError("--record always needs --origin-dir (or BOOTSEER_DEPSNAP_ORIGIN_DIR): "
                        "the directory the record is saved in")
    origin_url = args.origin_url or (f"file://{origin_dir}" if origin_dir else "")
    return MountOptions(expected(lambda: check_key(args.key)), args.mountpoint.absolute(),
                        args.tracker, args.api_socket, args.store_dir.absolute(),
                        args.read_timeout_s, args.read_ahead_kb, args.allow_other,
                        origin_url, origin_dir, args.record, args.record_window_s,
                        args.prefetch, args.passthrough, args.server,
                        getattr(args, "summary", None))


def _run_serve(args: argparse.Namespace) -> int:
    from fusefs.mount import run_serving

    return run_serving(args)


def _serving(args: argparse.Namespace) -> Any:
    """`depsnap serve`'s `fusefs.mount.Serving`: an OSError while serving (a file the
    user named, a full disk) is a UserError too."""
    from depsnap.places import places
    from fusefs.mount import Serving, check_fuse

    opts, secret = _options(args), places(args).secret
    check_fuse()

    async def serve(ready: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
        try:
            return await serve_snapshot(opts, secret, ready)
        except OSError as exc:
            raise UserError(f"{exc.filename or ''}: {exc.strerror}") from None

    return Serving(serve, kernel=opts.passthrough or opts.server == "kernel",
                   finish=lambda summary: _finish(opts, summary))


def _finish(opts: MountOptions, summary: dict[str, Any]) -> None:
    from fusefs.mount import write_summary

    log.info("served key %s: %s", opts.key, summary)
    write_summary(opts.summary, summary)


def _run_mount(args: argparse.Namespace) -> int:
    from fusefs.mount import MountError, mount_log, start_detached
    from p2p.auth import load_secret

    opts = _options(args)
    load_secret()  # fail here, not in the serving process
    log_path = mount_log("depsnap")
    try:
        ready = start_detached(opts.argv(), log_path, opts.read_timeout_s + 60.0)
    except MountError as exc:
        raise UserError(str(exc)) from None
    print(json.dumps({**ready, "log": str(log_path)}))
    return 0
