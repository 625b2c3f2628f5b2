"""A launch's environment installed at its path without touching that path on the host.

A requirements launch whose snapshot nobody published yet installs the
environment at `path` and publishes it (a venv is made for its prefix: its
scripts and `activate` name it, so it cannot be installed elsewhere and moved).
Done in place, that writes into the host's `path` (/opt/venv by default) and
leaves it behind after the job, over whatever was there. Instead the install
runs in a child process with a mount namespace of its own (unshare(2) and a
bind mount, through fusefs.image.mounts), in which the launch's tmpfs is bound
over `path`: the venv is made for `path`, lives in the
launch's memory, and goes with the launch, as a restored one does. Only a
`path` that does not exist is created on the host (a bind needs a mount point),
empty, and removed afterwards.

The child is this module run as a program: it reads what to do as JSON on its
stdin (the cluster secret included, so it never shows in a process list),
binds, runs `depsnap.run.run`, and writes its exit status and summary as one
JSON line on stdout. The installer's own output goes to stderr, as in
`depsnap run`.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from p2p.errors import UserError


class PrivateInstallError(UserError):
    """The private install could not run; the message says why."""


async def install(places: Any, python: str, argv: list[str], path: str, memory: Path,
                  cwd: Path) -> tuple[int, dict[str, Any]]:
    """Restore or install-and-publish the environment of `argv` for `path`, with its files
    in `memory` (an empty directory of the launch's tmpfs); (exit status, summary)."""
    created = _make_mount_point(Path(path))
    spec = {**{k: str(v) if isinstance(v, Path) else v for k, v in asdict(places).items()},
            "secret": places.secret.hex(), "python": python, "argv": argv, "prefix": path,
            "memory": str(memory), "cwd": str(cwd)}
    try:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", __name__, stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE)
        out, _ = await proc.communicate(json.dumps(spec).encode())
    finally:
        if created is not None:
            _remove_empty(created, Path(path))
    try:
        answer = json.loads(out.decode().splitlines()[-1])
    except (IndexError, ValueError):
        raise PrivateInstallError(f"installing the environment for {path} in a private mount "
                                  f"namespace failed (exit {proc.returncode}, no answer); "
                                  "its messages are above") from None
    if "error" in answer:
        raise PrivateInstallError(str(answer["error"]))
    return int(answer["status"]), dict(answer["summary"])


def _make_mount_point(path: Path) -> Path | None:
    """Create `path` if it is missing; the topmost directory created, or None."""
    missing = [p for p in (path, *path.parents) if not p.exists()]
    if not missing:
        return None
    path.mkdir(parents=True)
    return missing[-1]


def _remove_empty(top: Path, path: Path) -> None:
    """Remove the directories `_make_mount_point` created, from `path` up to `top`, if
    they are still empty."""
    for directory in (path, *path.parents):
        try:
            directory.rmdir()
        except OSError:
            return
        if directory == top:
            return


def _child() -> int:
    from depsnap.inputs import gather
    from depsnap.run import Places, run
    from fusefs.image.mounts import bind, own_mount_namespace

    spec = json.load(sys.stdin)
    prefix = Path(spec["prefix"])
    try:
        own_mount_namespace()
        bind(Path(spec["memory"]), prefix)
        places = Places(spec["tracker"], bytes.fromhex(spec["secret"]), spec["api_socket"],
                        _path(spec["origin_dir"]), spec["origin_url"], _path(spec["cache_dir"]),
                        _path(spec["store_dir"]), spec["origin_registry"])
        inputs = gather(spec["argv"], prefix, spec["python"], os.environ, Path(spec["cwd"]))
        status, summary = run(places, inputs, spec["argv"], prefix, os.environ)
    except (OSError, ValueError, UserError) as exc:
        print(json.dumps({"error": str(exc)}))
        return 1
    print(json.dumps({"status": status, "summary": summary}))
    return 0


def _path(value: str | None) -> Path | None:
    return Path(value) if value else None


if __name__ == "__main__":
    sys.exit(_child())
