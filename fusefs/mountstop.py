"""How a mount is stopped: by its process's signals, or by the mount server serving it.

A serving process of its own ends its mount on SIGTERM or SIGINT. A mount
served by a mount server's host (`fusefs.mounthost`) shares the process with
others: a signal would end them all, so the host stops each one by itself.
The host sets `mount_server` in the context of each mount's task; the code
that serves (`fusefs.kernelserve.serve_kernel`, `fusefs.mount`'s pyfuse3 path)
says what stops it with `stopped_by`, which asks whichever applies.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import signal
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from fusefs.kept import KeptDevice

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class MountServer(Protocol):
    """What a mount served by a mount server gets from it (`fusefs.mounthost`)."""

    def stopping(self, stop: Callable[[], None]) -> contextlib.AbstractContextManager[None]:
        """While in this context, `stop()` is how the server ends this mount."""

    def kept(self) -> KeptDevice | None:
        """The device of this mount, kept from a host that died (None: a new mount)."""

    def keep(self, device: KeptDevice) -> None:
        """Keep the device of this new mount, once INIT is answered (`fusefs.kept`)."""


mount_server: contextvars.ContextVar[MountServer | None] = contextvars.ContextVar(
    "mount_server", default=None)


@contextlib.contextmanager
def stopped_by(stop: Callable[[], None]) -> Iterator[None]:
    """While serving, `stop` ends this mount: on SIGTERM or SIGINT in a process of its
    own, at the mount server's word in a mount server (`mount_server`)."""
    server = mount_server.get()
    if server is not None:
        with server.stopping(stop):
            yield
        return
    loop = asyncio.get_running_loop()
    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, stop)
    try:
        yield
    finally:
        for sig in STOP_SIGNALS:
            loop.remove_signal_handler(sig)
