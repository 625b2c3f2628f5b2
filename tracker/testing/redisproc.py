"""A `redis-server` of our own on 127.0.0.1, for tests and `bootseer bench tracker`.

`RedisServer(workdir).start()` runs the Debian `redis-server` on a free port,
its data and log in `workdir`, and returns once it answers PING. With
`persistent`, it keeps an append-only file, so a restart keeps the tracker
log, snapshots and documents (what docs/operating.md tells operators to run);
without, a restart empties it. `stop` sends a signal and waits; `restart`
starts it again on the same port and directory.

It requires AUTH, as the tracker insists (docs/trust.md): a random password
(`requirepass`) written to `password_file` (mode 0600), which a tracker
replica is given with `--redis-password-file`; `client()` is a redis-py
client that uses it.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
import signal
from pathlib import Path

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from p2p.process import free_port

START_SECONDS = 10.0


class RedisMissing(RuntimeError):
    """redis-server cannot be run here."""


class RedisServer:
    def __init__(self, workdir: Path, persistent: bool = True) -> None:
        self.workdir = workdir
        self.persistent = persistent
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.password = secrets.token_hex(16)
        self.password_file = workdir / "redis.password"
        self._proc: asyncio.subprocess.Process | None = None

    @property
    def replica_args(self) -> list[str]:
        """The `bootseer tracker` flags that join a replica to this Redis."""
        return ["--redis", self.url, "--redis-password-file", str(self.password_file)]

    def client(self) -> aioredis.Redis:
        return aioredis.from_url(self.url, password=self.password, socket_connect_timeout=1.0)

    @property
    def pid(self) -> int:
        assert self._proc is not None, "not started"
        return self._proc.pid

    async def start(self) -> RedisServer:
        exe = shutil.which("redis-server")
        if exe is None:
            raise RedisMissing("redis-server is not installed (Debian package redis-server; "
                               "`make setup` installs it)")
        self.workdir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.password_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(self.password + "\n")
        log = self.workdir / "redis.log"
        self._proc = await asyncio.create_subprocess_exec(
            exe, "--bind", "127.0.0.1", "--port", str(self.port), "--dir", str(self.workdir),
            "--save", "", "--appendonly", "yes" if self.persistent else "no",
            "--logfile", str(log), "--daemonize", "no", "--requirepass", self.password,
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL)
        client = self.client()
        try:
            async with asyncio.timeout(START_SECONDS):
                while True:
                    if self._proc.returncode is not None:
                        raise RedisMissing(f"redis-server exited ({self._proc.returncode}); "
                                           f"see {log}")
                    try:
                        if await client.ping():
                            return self
                    except RedisError:
                        await asyncio.sleep(0.05)
        except TimeoutError:
            raise RedisMissing(f"redis-server did not answer within {START_SECONDS:g} s; "
                               f"see {log}") from None
        finally:
            await client.aclose()

    async def stop(self, sig: int = signal.SIGTERM) -> None:
        if self._proc is None or self._proc.returncode is not None:
            return
        self._proc.send_signal(sig)
        try:
            async with asyncio.timeout(10):
                await self._proc.wait()
        except TimeoutError:
            self._proc.kill()
            await self._proc.wait()

    async def restart(self, sig: int = signal.SIGTERM) -> None:
        await self.stop(sig)
        await self.start()
