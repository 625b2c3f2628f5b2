"""A real registry for the tests: Debian's `docker-registry` (distribution 2.8) (not a test module).

`running_registry(tmp, mode)` starts `/usr/bin/docker-registry serve CONFIG` on
127.0.0.1 at a free port, storing blobs under `tmp/storage`, in one of three
modes, and always stops it:

- `"none"`: anonymous pull and push;
- `"htpasswd"`: basic auth against an htpasswd file of bcrypt entries written
  by `htpasswd -B` (Debian `apache2-utils`);
- `"token"`: the registry's `auth: token:` mode. A `TokenIssuer` served by the
  fixture (aiohttp on 127.0.0.1, in a thread of its own so that blocking tools
  such as skopeo can use it while a test waits on them) checks Basic
  credentials and returns RS256 JWTs. Distribution 2.8 finds the signing key
  through the JWT's `x5c` header (the issuer's self-signed certificate, which
  is also the registry's `rootcertbundle`): that is what is used here. Its
  other route, `kid`, must be a libtrust key fingerprint.

Users: `USER`/`PASSWORD` may pull and push; in token mode `READER`/`PASSWORD`
may only pull, and anonymous callers get a token with no access at all.

A missing binary is a failure naming the package to install, never a skip.
The registry's own log (with its access log) is at `registry.log_path`.
"""

from __future__ import annotations

import asyncio
import base64
import datetime
import json
import shutil
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from cryptography.x509.oid import NameOID

from fusefs.testing.registry import RegistryStartError, local_registry
from p2p.origin.oci_auth import Credentials
from p2p.origin.oci_ref import ImageRef

USER, READER, PASSWORD = "bootseer", "reader", "correct horse battery"
SERVICE, ISSUER = "bootseer-test-registry", "bootseer-test-issuer"
START_TIMEOUT_S = 30.0
MODES = ("none", "htpasswd", "token")


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


class TokenIssuer:
    """A token server for the registry's token auth; records every request it answers."""

    def __init__(self, directory: Path) -> None:
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.cert = _self_signed(self.key)
        self.cert_path = directory / "token-cert.pem"
        self.cert_path.write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))
        self.requests: list[tuple[str | None, tuple[str, ...]]] = []  # (user, scopes)
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._runner: web.AppRunner | None = None

    @property
    def realm(self) -> str:
        return f"http://127.0.0.1:{self.port}/token"

    def start(self) -> None:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(START_TIMEOUT_S)

    def stop(self) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    async def _start(self) -> None:
        app = web.Application()
        app.router.add_get("/token", self._token)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def _token(self, request: web.Request) -> web.Response:
        user = _basic_user(request.headers.get("Authorization"))
        scopes = tuple(request.query.getall("scope", []))
        self.requests.append((user, scopes))
        if user == "":
            return web.json_response({"errors": [{"code": "UNAUTHORIZED",
                                                  "message": "bad credentials"}]}, status=401)
        access = [_grant(scope, user) for scope in scopes]
        return web.json_response({"token": self.sign(access, user or ""), "expires_in": 300})

    def sign(self, access: list[dict[str, object]], subject: str) -> str:
        der = self.cert.public_bytes(serialization.Encoding.DER)
        header = {"typ": "JWT", "alg": "RS256", "x5c": [base64.b64encode(der).decode()]}
        now = int(time.time())
        claims = {"iss": ISSUER, "sub": subject, "aud": SERVICE, "exp": now + 300,
                  "nbf": now - 10, "iat": now, "jti": uuid.uuid4().hex, "access": access}
        signing_input = (_b64url(json.dumps(header).encode()) + "." +
                         _b64url(json.dumps(claims).encode()))
        signature = self.key.sign(signing_input.encode(), padding.PKCS1v15(), hashes.SHA256())
        return signing_input + "." + _b64url(signature)


def _basic_user(header: str | None) -> str | None:
    """The user of a correct Basic header; None if absent; '' if wrong."""
    if not header:
        return None
    try:
        user, _, password = base64.b64decode(header.removeprefix("Basic ")).decode().partition(":")
    except ValueError:
        return ""
    return user if user in (USER, READER) and password == PASSWORD else ""


def _grant(scope: str, user: str | None) -> dict[str, object]:
    kind, _, rest = scope.partition(":")
    name, _, actions = rest.rpartition(":")
    allowed = {USER: {"pull", "push"}, READER: {"pull"}}.get(user or "", set())
    return {"type": kind, "name": name,
            "actions": [a for a in actions.split(",") if a in allowed]}


def _self_signed(key: rsa.RSAPrivateKey) -> x509.Certificate:
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, ISSUER)])
    now = datetime.datetime.now(datetime.UTC)
    return (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))


@dataclass
class RunningRegistry:
    mode: str
    address: str  # 127.0.0.1:PORT
    root: Path  # the registry's filesystem storage
    log_path: Path
    issuer: TokenIssuer | None = None
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    def ref(self, repository: str, tag: str | None = "latest") -> ImageRef:
        return ImageRef(self.address, repository, tag)

    def credentials(self, user: str = USER, password: str = PASSWORD) -> Credentials | None:
        return None if self.mode == "none" else Credentials(user, password)

    def blob_path(self, digest: str) -> Path:
        """Where the registry keeps a blob's bytes (distribution's filesystem layout)."""
        hexa = digest.removeprefix("sha256:")
        return (self.root / "docker" / "registry" / "v2" / "blobs" / "sha256" / hexa[:2] / hexa
                / "data")


def _auth_config(mode: str, directory: Path, issuer: TokenIssuer | None) -> dict[str, object]:
    match mode:
        case "none":
            return {}
        case "htpasswd":
            return {"htpasswd": {"realm": "bootseer-test", "path": str(_htpasswd(directory))}}
        case "token":
            assert issuer is not None
            return {"token": {"realm": issuer.realm, "service": SERVICE, "issuer": ISSUER,
                              "rootcertbundle": str(issuer.cert_path)}}
    raise ValueError(f"unknown registry mode {mode!r}; one of {MODES}")


def _htpasswd(directory: Path) -> Path:
    if shutil.which("htpasswd") is None:
        raise AssertionError("htpasswd not installed: apt-get install apache2-utils")
    lines = [subprocess.run(["htpasswd", "-Bbn", user, PASSWORD], check=True,
                            capture_output=True, text=True).stdout.strip()
             for user in (USER, READER)]
    path = directory / "htpasswd"
    path.write_text("\n".join(lines) + "\n")
    return path


@contextmanager
def running_registry(directory: Path, mode: str = "none") -> Iterator[RunningRegistry]:
    """A started registry in `mode` (see the module docstring); stopped on exit."""
    directory.mkdir(parents=True, exist_ok=True)
    issuer = TokenIssuer(directory) if mode == "token" else None
    if issuer is not None:
        issuer.start()
    try:
        with local_registry(directory, _auth_config(mode, directory, issuer)) as started:
            yield RunningRegistry(mode, started.address, started.root, started.log_path,
                                  issuer, started.process)
    except RegistryStartError as exc:
        raise AssertionError(str(exc)) from None
    finally:
        if issuer is not None:
            issuer.stop()
