"""How a local command finds this node's agent when it is not told where its socket is.

An agent started with `--api-socket PATH` (or `api_socket` in its config file)
listens where a later `bootseer status` would not look. So every agent, once
its socket is bound, leaves a symbolic link to it in `RUN_DIR/agents/PID`
(`RUN_DIR` is `BOOTSEER_RUN_DIR`, by default /run/bootseer) and removes it when
it stops. A command with no `--api-socket` and no `BOOTSEER_API_SOCKET` uses
the one running agent found there; with several it names them and asks which.
Links left by agents that died are ignored (and removed when we may).
"""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path

from p2p.errors import UserError

DEFAULT_API_SOCKET = "/run/bootseer/agent.sock"
log = logging.getLogger(__name__)


def run_dir() -> Path:
    return Path(os.environ.get("BOOTSEER_RUN_DIR") or "/run/bootseer")


def register(socket_path: Path) -> Path | None:
    """Leave a link to the agent's socket; the link, for `unregister`, or None if the
    directory cannot be written (the agent works without: commands then need the path)."""
    link = run_dir() / "agents" / str(os.getpid())
    try:
        link.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            link.unlink()
        link.symlink_to(socket_path.absolute())
    except OSError as exc:
        log.debug("cannot register the API socket in %s: %s", link.parent, exc)
        return None
    return link


def unregister(link: Path | None) -> None:
    if link is not None:
        with contextlib.suppress(OSError):
            link.unlink()


def running_agents() -> list[Path]:
    """The sockets of the agents registered and still running on this node."""
    found = []
    directory = run_dir() / "agents"
    with contextlib.suppress(FileNotFoundError):
        for link in sorted(directory.iterdir()):
            if link.name.isdigit() and _alive(int(link.name)) and link.exists():
                found.append(Path(os.readlink(link)))
            else:
                with contextlib.suppress(OSError):
                    link.unlink()
    return found


def find_api_socket(given: str | None) -> str:
    """The socket to use: `given` (the flag), BOOTSEER_API_SOCKET, the one running agent
    registered, or the default path; UserError when several agents could be meant."""
    if given:
        return given
    if os.environ.get("BOOTSEER_API_SOCKET"):
        return os.environ["BOOTSEER_API_SOCKET"]
    agents = running_agents()
    if len(agents) == 1:
        return str(agents[0])
    if len(agents) > 1:
        if Path(DEFAULT_API_SOCKET) in agents:
            return DEFAULT_API_SOCKET
        raise UserError(f"{len(agents)} agents run on this node; say which with --api-socket: "
                        + ", ".join(map(str, agents)))
    return DEFAULT_API_SOCKET


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's agent: alive
        return True
    return True
