"""The seam through which a content kind joins a launch.

The launch itself knows the image. Every other part (a dependency snapshot, a
checkpoint) is contributed by the package that owns that content kind, through the
`bootseer.launch_parts` entry-point group, so the arrows point one way: depsnap and
hdfs_stripe build on fusefs, and fusefs never imports them.

A part is an object with:

- `name`: its table in launch.toml (`[env]`, `[ckpt]`);
- `add_flags(parser)` and `flag_settings(args)`: its command-line flags, and the
  table they give (None for a flag not given, laid over the file's table);
- `parse(table, base_dir)`: the checked plan (`fusefs.launch.plan.PartPlan`) or None;
  its expected failures are `p2p.errors.UserError`s, like everyone's;
- `fork(plan, context, start)`: called before the launch has an event loop or a
  thread, it starts the mounts the part serves (`start(name, command)`, where
  `command(mountpoint)` is the mount's `fusefs.image.starter.MountCommand`: the
  node's mount server serves it, or a child the launch forks), and returns the
  coroutine function that brings the part up on the loop and says what it brought:
  binds into the container, environment variables, the contents it fetched and its
  timeline entry (`Up`, which says who served each mount: `served_by`).
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, Protocol

from fusefs.image.process import Bind
from fusefs.image.starter import Mount, MountCommand
from fusefs.launch.plan import PartPlan

GROUP = "bootseer.launch_parts"


@dataclass
class Context:
    """What a part may use while the launch runs."""

    args: argparse.Namespace  # the command line (a part builds its own places from it)
    scratch: Path  # the launch's scratch directory, gone with it
    memory: contextlib.ExitStack  # mounts (tmpfs) to undo when the launch ends
    since: Callable[[], float]  # seconds since the launch started


@dataclass
class Up:
    """What a part brought up."""

    timeline: dict[str, Any]  # its entry in the launch's timeline (ready_s and the rest)
    binds: list[Bind] = field(default_factory=list)
    environ: dict[str, str] = field(default_factory=dict)  # PATH is prepended to the image's
    contents: list[str] = field(default_factory=list)  # content ids: its bytes are counted


Fork = Callable[[str, Callable[[Path], MountCommand]], Mount]
BringUp = Callable[[Context], Awaitable[Up]]


class LaunchPart(Protocol):
    name: str

    def add_flags(self, parser: argparse.ArgumentParser) -> None: ...

    def flag_settings(self, args: argparse.Namespace) -> dict[str, object]: ...

    def parse(self, table: Mapping[str, object] | None, base_dir: str) -> PartPlan | None: ...

    def fork(self, plan: PartPlan, context: Context, fork: Fork) -> BringUp: ...


def load_parts() -> dict[str, LaunchPart]:
    """Every installed part, by table name."""
    parts: dict[str, LaunchPart] = {}
    for ep in entry_points(group=GROUP):
        part: LaunchPart = ep.load()
        parts[part.name] = part
    return dict(sorted(parts.items()))
