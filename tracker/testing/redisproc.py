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
client that uses it. With `tls`, it serves TLS only, under a certificate for
127.0.0.1 signed by a CA made for it (`ca_file`), at a `rediss://` URL.
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
    def __init__(self, workdir: Path, persistent: bool = True, tls: bool = False) -> None:
        self.workdir = workdir
        self.persistent = persistent
        self.tls = tls
        self.port = free_port()
        self.url = f"{'rediss' if tls else 'redis'}://127.0.0.1:{self.port}/0"
        self.password = secrets.token_hex(16)
        self.password_file = workdir / "redis.password"
        self.ca_file = workdir / "ca.pem"
        self._proc: asyncio.subprocess.Process | None = None

    @property
    def replica_args(self) -> list[str]:
        """The `bootseer tracker` flags that join a replica to this Redis."""
        tls = ["--redis-ca-file", str(self.ca_file)] if self.tls else []
        return ["--redis", self.url, "--redis-password-file", str(self.password_file), *tls]

    def client(self) -> aioredis.Redis:
        tls = {"ssl_ca_certs": str(self.ca_file)} if self.tls else {}
        return aioredis.from_url(self.url, password=self.password, socket_connect_timeout=1.0,
                                 **tls)

    def _listen_args(self) -> list[str]:
        if not self.tls:
            return ["--port", str(self.port)]
        if not (self.workdir / "server.pem").exists():
            _make_certificates(self.workdir)
        return ["--port", "0", "--tls-port", str(self.port),
                "--tls-cert-file", str(self.workdir / "server.pem"),
                "--tls-key-file", str(self.workdir / "server.key"),
                "--tls-ca-cert-file", str(self.ca_file), "--tls-auth-clients", "no"]

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
            exe, "--bind", "127.0.0.1", *self._listen_args(), "--dir", str(self.workdir),
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


def _make_certificates(workdir: Path) -> None:
    """A CA (`ca.pem`) and a certificate for 127.0.0.1 it signs (`server.pem`, `.key`)."""
    import datetime
    import ipaddress

    from cryptography import x509  # a test dependency: only TLS test servers need it
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)

    def cert(subject: str, key: ec.EllipticCurvePrivateKey, issuer: str,
             signer: ec.EllipticCurvePrivateKey, ca: bool) -> x509.Certificate:
        builder = (x509.CertificateBuilder()
                   .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
                   .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(minutes=5))
                   .not_valid_after(now + datetime.timedelta(days=1))
                   .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
        if not ca:
            builder = builder.add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        return builder.sign(signer, hashes.SHA256())

    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    pem = serialization.Encoding.PEM
    (workdir / "ca.pem").write_bytes(
        cert("bootseer test CA", ca_key, "bootseer test CA", ca_key, True).public_bytes(pem))
    (workdir / "server.pem").write_bytes(
        cert("127.0.0.1", key, "bootseer test CA", ca_key, False).public_bytes(pem))
    (workdir / "server.key").write_bytes(key.private_bytes(
        pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
