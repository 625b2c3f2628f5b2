"""A real OCI registry on loopback, and a rate cap in front of it: for tests and benchmarks.

`local_registry` starts Debian's `docker-registry` (distribution v2) with a
config of our own: 127.0.0.1 on a free port, filesystem storage under the
given directory, deletes enabled, the access log on (tests read it to see
which blobs were fetched), and the `auth` section the caller passes (none,
htpasswd or token: see tests/helpers/registry.py). It waits until `/v2/` answers and
always stops the process.

`CappedProxy` relays TCP connections to an upstream address and caps the
bytes it sends back, all connections together, with one `p2p.ratelimit`
token bucket: a registry with a bandwidth limit, which docker-registry itself
does not have. It counts the bytes it relayed each way.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from p2p.process import free_port, stop_popen
from p2p.ratelimit import TokenBucket

REGISTRY_BIN = "/usr/bin/docker-registry"
START_TIMEOUT_S = 30.0
RELAY_BLOCK = 256 << 10
BURST_BYTES = 1 << 20


class RegistryStartError(Exception):
    """A component of the testbed cannot start; the message names what is missing."""


@dataclass(frozen=True, slots=True)
class Registry:
    address: str  # 127.0.0.1:PORT
    root: Path  # filesystem storage
    log_path: Path
    process: subprocess.Popen[bytes] = field(repr=False)


@contextlib.contextmanager
def local_registry(directory: Path, auth: dict[str, object] | None = None
                   ) -> Iterator[Registry]:
    """A started docker-registry on 127.0.0.1 (see the module docstring); stopped on exit."""
    if not Path(REGISTRY_BIN).is_file():
        raise RegistryStartError(
            "docker-registry is not installed: apt-get install docker-registry")
    directory.mkdir(parents=True, exist_ok=True)
    log_path = directory / "registry.log"
    process = None
    try:
        for _ in range(3):  # a free port can be taken between probe and bind
            port = free_port()
            with log_path.open("ab") as log:
                process = subprocess.Popen(
                    [REGISTRY_BIN, "serve", str(_write_config(directory, port, auth or {}))],
                    stdout=log, stderr=subprocess.STDOUT)
            if _wait_ready(process, port, log_path):
                break
        else:
            raise RegistryStartError(f"docker-registry exited at start; its log:\n"
                               f"{log_path.read_text()[-2000:]}")
        yield Registry(f"127.0.0.1:{port}", directory / "storage", log_path, process)
    finally:
        if process is not None:
            stop_popen(process)


def _write_config(directory: Path, port: int, auth: dict[str, object]) -> Path:
    config = {
        "version": "0.1",
        "log": {"level": "info", "accesslog": {"disabled": False}},
        "storage": {"filesystem": {"rootdirectory": str(directory / "storage")},
                    "delete": {"enabled": True}},
        "http": {"addr": f"127.0.0.1:{port}", "secret": uuid.uuid4().hex},
        "auth": auth,
    }
    path = directory / "config.yml"
    path.write_text(json.dumps(config, indent=1))  # YAML is a superset of JSON
    return path


def _wait_ready(process: subprocess.Popen[bytes], port: int, log_path: Path) -> bool:
    """True once /v2/ answers; False if the process exited (e.g. the port was taken)."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            return False
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/", timeout=1).close()
            return True
        except urllib.error.HTTPError:
            return True  # 401: up, and asking for credentials
        except OSError:
            time.sleep(0.05)
    raise RegistryStartError(f"docker-registry did not answer within {START_TIMEOUT_S:g} s; its "
                       f"log:\n{log_path.read_text()[-2000:]}")


class CappedProxy:
    """TCP relay to `upstream` with one egress cap for all connections (see module doc)."""

    def __init__(self, upstream: str, rate_mbps: float | None, listen: str = "127.0.0.1"
                 ) -> None:
        self._listen = listen
        host, port = upstream.rsplit(":", 1)
        self._upstream = (host, int(port))
        self._bucket = TokenBucket(rate_mbps * 1e6 if rate_mbps else None, BURST_BYTES)
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.sent_bytes = 0  # upstream -> clients
        self.received_bytes = 0  # clients -> upstream
        self.address = ""

    async def __aenter__(self) -> CappedProxy:
        self._server = await asyncio.start_server(self._accept, self._listen, 0)
        self.address = f"{self._listen}:{self._server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self._upstream)
        except OSError:
            writer.close()
            return
        loop = asyncio.get_running_loop()
        for task in (loop.create_task(self._pump(reader, up_writer, capped=False)),
                     loop.create_task(self._pump(up_reader, writer, capped=True))):
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _pump(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter,
                    capped: bool) -> None:
        loop = asyncio.get_running_loop()
        try:
            while data := await src.read(RELAY_BLOCK):
                if capped:
                    self.sent_bytes += len(data)
                    wait = self._bucket.reserve(len(data), loop.time())
                    if wait > 0:
                        await asyncio.sleep(wait)
                else:
                    self.received_bytes += len(data)
                dst.write(data)
                await dst.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            dst.close()
