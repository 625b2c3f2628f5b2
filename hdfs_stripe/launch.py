"""The checkpoint's part of `bootseer launch`: the `[ckpt]` table.

Each HDFS URI is mounted read-only (one URI at `path`, several at `path/NAME`), its
stripes shared through the swarm, and with `prefetch` every stripe is fetched
before the job starts. The container sees the checkpoint at `path`, named by
BOOTSEER_CKPT.

Registered as the `ckpt` entry of `bootseer.launch_parts` (see fusefs.launch.part).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import posixpath
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from fusefs.image.process import Bind
from fusefs.image.starter import MountCommand, served_by
from fusefs.launch.part import BringUp, Context, Fork, Up
from fusefs.launch.plan import PartPlan, PlanError, absolute, flag, known, strings

log = logging.getLogger(__name__)


def content_files(mountpoint: Path, ready: Mapping[str, Any]) -> list[Path]:
    """The files of a checkpoint mount that hold bytes (an empty file has no content)."""
    return [mountpoint / f["path"].lstrip("/") for f in ready["files"] if f["content"]]


def open_once(path: Path) -> None:
    """Open a file of a mount once, now that its chunks are local: its serving process
    builds and checks a large file's backing file at that open (fusefs.backing,
    BUILD_AT_OPEN_BYTES), so the job's first read goes by passthrough instead of
    through the handler (benchmarks/fuse_read.py, `unbuilt_*`)."""
    with open(path, "rb"):
        pass


READY_TIMEOUT_S = 300.0  # a mount that has not served by then has failed
DEFAULT_PATH = "/ckpt"
KEYS = ("uris", "path", "prefetch")


@dataclass(frozen=True, slots=True)
class CkptPlan:
    uris: tuple[str, ...]
    path: str
    prefetch: bool

    def mounts(self) -> list[tuple[str, str]]:
        """(URI, path in the container) for each URI: one at `path`, several under it."""
        if len(self.uris) == 1:
            return [(self.uris[0], self.path)]
        return [(uri, posixpath.join(self.path, _last_name(uri))) for uri in self.uris]

    def targets(self) -> list[str]:
        return [target for _, target in self.mounts()]


def parse_ckpt(table: Mapping[str, object] | None, base_dir: str) -> CkptPlan | None:
    if not table:
        return None
    known(table, "ckpt", KEYS)
    uris = strings(table, "uris", "ckpt")
    if not uris:
        return None
    for uri in uris:
        if not uri.startswith("hdfs://"):
            raise PlanError(f"[ckpt] uris: {uri!r} is not an hdfs://HOST:PORT/path URI")
    plan = CkptPlan(tuple(uris), absolute(table, "path", "ckpt", DEFAULT_PATH),
                    flag(table, "prefetch", "ckpt", True))
    names = plan.targets()
    if len(set(names)) != len(names):
        raise PlanError("[ckpt] uris: two URIs end in the same name; each is mounted at "
                        f"{plan.path}/NAME, so their last path components must differ")
    return plan


class CkptPart:
    name = "ckpt"

    def add_flags(self, parser: argparse.ArgumentParser) -> None:
        c = parser.add_argument_group("checkpoint")
        c.add_argument("--ckpt", action="append", metavar="URI",
                       help="hdfs://HOST:PORT/path; repeat for several")
        c.add_argument("--ckpt-path", metavar="DIR",
                       help=f"where it appears in the image (default {DEFAULT_PATH})")
        c.add_argument("--no-ckpt-prefetch", dest="ckpt_prefetch", action="store_false",
                       default=None, help="fetch stripes on first read only")

    def flag_settings(self, args: argparse.Namespace) -> dict[str, object]:
        return {"uris": args.ckpt, "path": args.ckpt_path, "prefetch": args.ckpt_prefetch}

    def parse(self, table: Mapping[str, object] | None, base_dir: str) -> PartPlan | None:
        return parse_ckpt(table, base_dir)

    def fork(self, plan: PartPlan, context: Context, fork: Fork) -> BringUp:
        from hdfs_stripe.mount import MountOptions
        from p2p.auth import load_secret

        assert isinstance(plan, CkptPlan)
        args, secret = context.args, load_secret()

        def command(uri: str) -> Callable[[Path], MountCommand]:
            def at(mountpoint: Path) -> MountCommand:
                opts = MountOptions(uri, mountpoint, args.tracker, args.api_socket,
                                    args.store_dir.absolute(), allow_other=True)

                async def serve(ready: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
                    from hdfs_stripe.mount import serve_ckpt

                    return await serve_ckpt(opts, secret, ready)

                return MountCommand(lambda summary: replace(opts, summary=summary).argv(),
                                    serve)
            return at

        mounts = [(target, fork(f"ckpt{i}", command(uri)))
                  for i, (uri, target) in enumerate(plan.mounts())]

        async def bring_up(ctx: Context) -> Up:
            from p2p.agentclient import AgentClient
            from p2p.progress import while_fetching

            readies = await asyncio.gather(*(m.wait_ready(READY_TIMEOUT_S)
                                             for _, m in mounts))
            files = [f for ready in readies for f in ready["files"]]
            contents = [f["content"] for f in files if f["content"]]
            if plan.prefetch:
                async with AgentClient(args.api_socket) as agent:
                    await while_fetching(agent, "checkpoint", contents,
                                         asyncio.gather(*(agent.ensure(c) for c in contents)),
                                         total=sum(f["size"] for f in files if f["content"]))
                # Every file at once, concurrent with the image's and the environment's
                # bring-up: the serving process builds each on a thread of its own
                # (benchmarks/open_many.py), as many at a time as the default executor
                # runs these opens (min(32, cores + 4)).
                await asyncio.gather(*(asyncio.to_thread(open_once, path)
                                       for (_, m), ready in zip(mounts, readies, strict=True)
                                       for path in content_files(m.mountpoint, ready)))
            log.info("checkpoint up in %.3f s: %d files", ctx.since(), len(files))
            return Up({"ready_s": ctx.since(), "files": len(files),
                       "bytes": sum(f["size"] for f in files),
                       "indexed_here": sum(bool(f["indexed"]) for f in files),
                       "prefetched": plan.prefetch,
                       "served_by": sorted({served_by(m) for _, m in mounts})},
                      binds=[Bind(m.mountpoint, target) for target, m in mounts],
                      environ={"BOOTSEER_CKPT": plan.path}, contents=contents)

        return bring_up


PART = CkptPart()


def _last_name(uri: str) -> str:
    return uri.rstrip("/").rsplit("/", 1)[-1] or "root"
