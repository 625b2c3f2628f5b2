"""Running the external tools the image code drives (skopeo, umoci, debootstrap, tar, runc...).

Each tool is looked up on PATH before use; a missing one is a `ToolError`
naming the Debian package that provides it, so the user reads what to install
rather than a `FileNotFoundError`. A tool that fails is a `ToolError` carrying
the command and the tail of its stderr (a tool's last lines say why). The
module knows nothing of images: callers pass the arguments and say what the
call was for.
"""

from __future__ import annotations

import asyncio
import shlex

from p2p.errors import UserError
from p2p.process import ToolMissing, require_tool

STDERR_TAIL_BYTES = 2000

# tool -> Debian package that installs it
PACKAGES = {
    "bwrap": "bubblewrap",
    "debootstrap": "debootstrap",
    "gzip": "gzip",
    "runc": "runc",
    "skopeo": "skopeo",
    "tar": "tar",
    "umoci": "umoci",
}


class ToolError(UserError, RuntimeError):
    """An external tool is missing or failed; the message says which and why."""


def require(tool: str, error: type[ToolError] = ToolError) -> str:
    """The path of `tool`, or `error` naming the Debian package to install."""
    try:
        return require_tool(tool, PACKAGES.get(tool, tool))
    except ToolMissing as exc:
        raise error(str(exc)) from None


def tail(data: bytes) -> str:
    """The last lines of a tool's output, decoded for a message."""
    return data[-STDERR_TAIL_BYTES:].decode(errors="replace").strip()


async def run_tool(args: list[str], what: str) -> bytes:
    """Run `args` (args[0] looked up with `require`) to completion; its stdout.

    stderr is captured for the error message only; stdin is /dev/null so a
    tool never waits on the caller's terminal.
    """
    command = [require(args[0]), *args[1:]]
    process = await asyncio.create_subprocess_exec(
        *command, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    try:
        out, err = await process.communicate()
    except asyncio.CancelledError:
        if process.returncode is None:
            process.kill()
            await process.wait()
        raise
    if process.returncode != 0:
        raise ToolError(f"{what} failed (exit {process.returncode}): {shlex.join(args)}\n"
                        f"{tail(err)}")
    return out
