"""A request to the mount server (`fusefs.server`): the serving command to run, and
the client's call (`fork_serving`).

One message, JSON `{"argv", "cwd", "env"}` and optionally `"end_with_client":
true`; `argv` must be a serving command, `[python, "-m", MODULE, ...]` with
MODULE one of `SERVING_MODULES`. Checked by the server before it forks, and
by its host (`fusefs.mounthost`) before it serves one itself.

Ending with the client. A client that waits for its mount and stops it
itself (`bootseer image run`, `fusefs.served`) asks for `end_with_client`:
its mount must not outlive it, however it dies (SIGKILL included), as a
forked child's PDEATHSIG guarantees (`fusefs.image.forked`). The server opens
a pidfd of the requesting process while it is connected and waiting for the
answer (its pid from SO_PEERCRED: the kernel's word, and alive then, so
the pidfd names it and no later process with its pid); the mount's handle
(or the forked serving process) watches that pidfd and stops the mount when
it becomes readable: the client has exited.
"""

from __future__ import annotations

import json
import os
import socket
from dataclasses import dataclass
from typing import Any

SERVING_MODULES = ("depsnap", "fusefs", "fusefs.image", "hdfs_stripe")
MAX_REQUEST_BYTES = 1 << 20
SERVER_ENV = "BOOTSEER_MOUNT_SERVER"
REQUEST_TIMEOUT_S = 5.0


class ServerUnavailable(Exception):
    """Nothing answers at the server's socket (the caller may start the process itself)."""


class ServerRefused(Exception):
    """The server answered with an error; the message is its reason."""



@dataclass(frozen=True, slots=True)
class Request:
    argv: list[str]
    cwd: str
    env: dict[str, str]
    end_with_client: bool = False

    @property
    def module(self) -> str:
        return self.argv[2]

    @classmethod
    def parse(cls, data: bytes) -> Request:
        """The request in `data`; ServerRefused saying what is wrong with it."""
        try:
            raw = json.loads(data)
        except (ValueError, UnicodeDecodeError):
            raise ServerRefused("the request is not JSON") from None
        if not isinstance(raw, dict):
            raise ServerRefused("the request is not a JSON object")
        argv, cwd, env = raw.get("argv"), raw.get("cwd"), raw.get("env")
        if not (isinstance(argv, list) and all(isinstance(a, str) for a in argv)):
            raise ServerRefused("argv must be a list of strings")
        if not isinstance(cwd, str) or not os.path.isabs(cwd):
            raise ServerRefused("cwd must be an absolute path")
        if not (isinstance(env, dict)
                and all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())):
            raise ServerRefused("env must map strings to strings")
        end_with_client = raw.get("end_with_client", False)
        if not isinstance(end_with_client, bool):
            raise ServerRefused("end_with_client must be true or false")
        if len(argv) < 3 or argv[1] != "-m" or argv[2] not in SERVING_MODULES:
            raise ServerRefused(f"not a serving command: {' '.join(argv[:3])!r} (the server "
                                f"runs python -m {'|'.join(SERVING_MODULES)} only)")
        return cls(argv, cwd, env, end_with_client)

    def to_bytes(self) -> bytes:
        fields: dict[str, Any] = {"argv": self.argv, "cwd": self.cwd, "env": self.env}
        if self.end_with_client:
            fields["end_with_client"] = True
        return json.dumps(fields).encode()


def fork_serving(server: str, argv: list[str], stdout: int, stderr: int,
                 end_with_client: bool = False) -> int:
    """Have the mount server at `server` run `argv` with these descriptors as stdout and
    stderr; the pid of the process that stands for the mount: its own serving process,
    or its handle if the server's host serves it (SIGTERM stops the mount either way).
    `end_with_client`: the mount stops when this process exits (see the module
    docstring). ServerUnavailable if nothing answers there, ServerRefused if the server
    will not run it."""
    request = Request(argv, os.getcwd(), dict(os.environ), end_with_client).to_bytes()
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as sock:
        sock.settimeout(REQUEST_TIMEOUT_S)
        try:
            sock.connect(server)
        except OSError as exc:
            raise ServerUnavailable(f"no mount server answers at {server} "
                                    f"({exc.strerror or exc})") from None
        try:
            socket.send_fds(sock, [request], [stdout, stderr])
            reply = sock.recv(MAX_REQUEST_BYTES)
        except OSError as exc:
            raise ServerUnavailable(f"the mount server at {server} did not answer "
                                    f"({exc.strerror or exc})") from None
    try:
        answer: dict[str, Any] = json.loads(reply)
    except ValueError:
        raise ServerUnavailable(f"the mount server at {server} gave no answer") from None
    if isinstance(answer.get("pid"), int):
        return int(answer["pid"])
    raise ServerRefused(f"the mount server at {server} refused: {answer.get('error')}")
