"""Who serves the mounts of `bootseer image run` and `bootseer launch`: the node's mount
server, or a child forked here. One rule for both commands.

The rule. Where BOOTSEER_MOUNT_SERVER names the node's mount server
(`fusefs.server`), every mount is asked of it (`fusefs.image.served`): its serving
command line, ended with this process (SIGKILL included), its end summary written
beside its log. When nothing answers there, this process says so once, on stderr,
and forks each mount's serving child itself (`fusefs.image.forked`), as before the
server existed. A refusal by the server is the mount's error (MountError), as for
the `mount` commands.

A mount is described both ways (`MountCommand`): its serving command line, given
the file its end summary goes to (`--summary`), for the server; and the same serving
as a coroutine for a forked child, which imports the serving code only after the
fork, so the process that starts mounts through the server never imports it. A
command may name modules to import here before a fork (`preload`): a launch forks
several children, which then share one import instead of each doing its own.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from fusefs.image.forked import ForkedMount, Serve, summary_path
from fusefs.image.served import ServedMount
from fusefs.mount import MountError
from fusefs.request import SERVER_ENV, ServerRefused, ServerUnavailable

Mount = ForkedMount | ServedMount


@dataclass(frozen=True)
class MountCommand:
    """One mount, as either side serves it (see the module docstring)."""

    argv: Callable[[Path], list[str]]  # the serving command line, given its --summary file
    serve: Serve  # the same serving, run by a forked child
    preload: tuple[str, ...] = ()  # modules to import before forking that child


class MountStarter:
    """Starts mounts by the rule of the module docstring; `expected`: the errors a forked
    child reports as its message (MountError in `wait_ready`), not with its log."""

    def __init__(self, expected: tuple[type[Exception], ...],
                 server: str | None = None) -> None:
        self.expected = expected
        self.server = server if server is not None else os.environ.get(SERVER_ENV) or None

    def start(self, command: MountCommand, mountpoint: Path, log_path: Path) -> Mount:
        """The mount of `command` at `mountpoint`, logging to `log_path` (a new file).
        Call before this process has an event loop or a thread: it may fork."""
        if self.server is not None:
            try:
                return ServedMount.start(self.server, command.argv(summary_path(log_path)),
                                         mountpoint, log_path)
            except ServerRefused as exc:
                raise MountError(str(exc)) from None
            except ServerUnavailable as exc:
                print(f"bootseer: {exc} ({SERVER_ENV}); starting the mount process here",
                      file=sys.stderr, flush=True)
                self.server = None
                log_path.unlink(missing_ok=True)
        for module in command.preload:
            importlib.import_module(module)
        return ForkedMount.start(command.serve, mountpoint, log_path, self.expected)


def served_by(mount: Mount) -> str:
    """What a timeline says of who served `mount`."""
    return "mount server" if isinstance(mount, ServedMount) else "forked"
