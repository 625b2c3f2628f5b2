"""The dependency snapshot's part of `bootseer launch`: the `[env]` table.

By key, a published snapshot is restored into a private tmpfs of the launch (or,
with `mode = "mount"`, mounted lazily and read-only) and bound at the prefix it was
made for. By requirements, the requirements' snapshot is restored if anyone
published it, else installed here for `path` and published; the install too
lands in the launch's tmpfs, never in the host's `path` (depsnap.private). Either
way the venv comes first on PATH in the container and is its VIRTUAL_ENV.

Registered as the `env` entry of `bootseer.launch_parts` (see fusefs.launch.part).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import posixpath
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from depsnap.key import KeyInputError, check_key
from fusefs.image.process import Bind
from fusefs.image.starter import MountCommand, served_by
from fusefs.launch.part import BringUp, Context, Fork, Up
from fusefs.launch.plan import PartPlan, PlanError, absolute, choice, known, text

if TYPE_CHECKING:
    from depsnap.run import Places

log = logging.getLogger(__name__)

READY_TIMEOUT_S = 300.0  # a mount that has not served by then has failed
MODES = ("restore", "mount")
INSTALLERS = ("pip", "uv")
DEFAULT_PATH = "/opt/venv"
KEYS = ("key", "requirements", "path", "mode", "python", "installer")


@dataclass(frozen=True, slots=True)
class EnvPlan:
    key: str | None  # a published snapshot ...
    requirements: str | None  # ... or a requirements file (a path on this host)
    path: str | None  # requirements mode: the venv's path, on the host and in the image
    # (a snapshot by key is bound at the prefix it was made for)
    mode: str  # "restore" (a private copy) or "mount" (lazy, read-only; key only)
    python: str
    installer: str

    def targets(self) -> list[str]:
        return [self.path] if self.path is not None else []

    def install_command(self) -> list[str]:
        """The command a requirements launch installs with when no snapshot exists."""
        assert self.requirements is not None
        pip = ["uv", "pip"] if self.installer == "uv" else ["pip"]
        return [*pip, "install", "-r", self.requirements]


def parse_env(table: Mapping[str, object] | None, base_dir: str) -> EnvPlan | None:
    if not table:
        return None
    known(table, "env", KEYS)
    key = text(table, "key", "env")
    if key is not None:
        try:
            check_key(key)
        except KeyInputError as exc:
            raise PlanError(f"[env] key: {exc}") from None
    requirements = text(table, "requirements", "env")
    if (key is None) == (requirements is None):
        raise PlanError("[env]: give exactly one of key (a published snapshot) or "
                        "requirements (a requirements file)")
    mode = choice(table, "mode", "env", MODES, "restore")
    if mode == "mount" and key is None:
        raise PlanError("[env] mode = \"mount\" needs a key: a requirements launch may have "
                        "to install, and an install is restored, not mounted")
    if key is not None and table.get("path") is not None:
        raise PlanError("[env] path: a snapshot given by key is bound at the prefix it was "
                        "made for (a venv works only there); path is for requirements")
    path = None if key is not None else absolute(table, "path", "env", DEFAULT_PATH)
    if requirements is not None and not posixpath.isabs(requirements):
        requirements = posixpath.normpath(posixpath.join(base_dir, requirements))
    return EnvPlan(key, requirements, path, mode, text(table, "python", "env") or "python3",
                   choice(table, "installer", "env", INSTALLERS, "pip"))


@dataclass(frozen=True, slots=True)
class _Env:
    source: Path  # on the host
    target: str  # in the container: the prefix the venv was made for
    action: str  # restored, mounted, created
    key: str
    packs: list[str]  # the contents this node fetched it from


class EnvPart:
    name = "env"

    def add_flags(self, parser: argparse.ArgumentParser) -> None:
        from depsnap.places import publish_flags, snapshot_flags

        e = parser.add_argument_group("environment (a dependency snapshot)")
        e.add_argument("--env-key", metavar="KEY", help="a published snapshot's key")
        e.add_argument("--env-requirements", type=Path, metavar="FILE",
                       help="a requirements file: restored if published, else installed here")
        e.add_argument("--env-path", metavar="DIR",
                       help=f"the venv's path (requirements only; default {DEFAULT_PATH})")
        e.add_argument("--env-mode", choices=MODES,
                       help="restore a private copy, or mount the snapshot lazily (key only)")
        e.add_argument("--python", metavar="PYTHON",
                       help="the interpreter of the venv and key")
        snapshot_flags(parser)
        publish_flags(parser)

    def flag_settings(self, args: argparse.Namespace) -> dict[str, object]:
        requirements = args.env_requirements.absolute() if args.env_requirements else None
        return {"key": args.env_key, "path": args.env_path, "mode": args.env_mode,
                "python": args.python,
                "requirements": str(requirements) if requirements else None}

    def parse(self, table: Mapping[str, object] | None, base_dir: str) -> PartPlan | None:
        return parse_env(table, base_dir)

    def fork(self, plan: PartPlan, context: Context, fork: Fork) -> BringUp:
        from depsnap.mount import MountOptions
        from depsnap.places import places

        assert isinstance(plan, EnvPlan)
        where = places(context.args, context.args.origin_dir)
        if plan.mode != "mount":
            return lambda ctx: _bring_up(plan, where, ctx)
        assert plan.key is not None
        key = plan.key

        def command(at: Path) -> MountCommand:
            opts = MountOptions(key, at, where.tracker, where.api_socket, where.store_dir,
                                allow_other=True, origin_url=where.origin_url,
                                origin_dir=where.origin_dir)

            async def serve(ready: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
                from depsnap.mount import serve_snapshot

                return await serve_snapshot(opts, where.secret, ready)

            return MountCommand(lambda summary: replace(opts, summary=summary).argv(), serve)

        mount = fork("env", command)

        async def mounted(ctx: Context) -> Up:
            ready = await mount.wait_ready(READY_TIMEOUT_S)
            up = _up(_Env(mount.mountpoint, str(ready["prefix"]), "mounted", ready["key"],
                          ready["packs"]), ctx)
            up.timeline["served_by"] = served_by(mount)
            return up

        return mounted


PART = EnvPart()


async def _bring_up(plan: EnvPlan, places: Places, ctx: Context) -> Up:
    if plan.key is not None:
        return _up(await _restore(places, plan.key, ctx), ctx)
    return _up(await _requirements(plan, places, ctx), ctx)


def _up(env: _Env, ctx: Context) -> Up:
    log.info("environment %s %s at %s in %.3f s", env.key, env.action, env.target,
             ctx.since())
    return Up({"ready_s": ctx.since(), "action": env.action, "key": env.key,
               "path": env.target},
              binds=[Bind(env.source, env.target, read_only=env.action == "mounted")],
              environ={"VIRTUAL_ENV": env.target, "PATH": f"{env.target}/bin"},
              contents=env.packs)


async def _restore(places: Places, key: str, ctx: Context, target: str | None = None) -> _Env:
    """Restore `key` into memory: a tmpfs of the launch's, gone with it. The copy is private
    and lives as long as the job; creating thousands of files costs a tenth of the system
    time there that it costs on a disk's filesystem (measured: 3,000 files, 0.11 s against
    0.73 s of system time on this machine's ext4)."""
    from depsnap.run import restore_key

    venv = _memory(ctx)
    summary = await restore_key(places, key, venv)
    return _Env(venv, target or summary["snapshot_prefix"], "restored", key, summary["packs"])


def _memory(ctx: Context) -> Path:
    """Where the environment's files live: a path in a tmpfs of the launch's."""
    from fusefs.image.mounts import mounted_tmpfs

    memory = ctx.scratch / "env"
    memory.mkdir()
    ctx.memory.enter_context(mounted_tmpfs(memory))
    return memory / "venv"


async def _requirements(plan: EnvPlan, places: Places, ctx: Context) -> _Env:
    """Restore the requirements' snapshot if published, else install it here and publish."""
    from depsnap.inputs import gather
    from depsnap.private import install
    from depsnap.run import snapshot_exists
    from fusefs.launch.run import LaunchError

    assert plan.path is not None
    argv = plan.install_command()
    inputs = await asyncio.to_thread(gather, argv, Path(plan.path), plan.python, os.environ,
                                     Path.cwd())
    key = inputs.key()
    if await snapshot_exists(places, key):
        return await _restore(places, key, ctx, plan.path)
    log.info("no snapshot for key %s yet: installing it for %s, in the launch's memory",
             key, plan.path)
    venv = _memory(ctx)
    venv.mkdir()
    status, summary = await install(places, plan.python, argv, plan.path, venv, Path.cwd())
    if status != 0:
        raise LaunchError(f"installing the environment failed ({' '.join(argv)} exited "
                          f"{status}); nothing was published")
    return _Env(venv, plan.path, summary["action"], key, [])
