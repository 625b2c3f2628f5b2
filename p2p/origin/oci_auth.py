"""Registry authentication: credentials, `WWW-Authenticate` challenges, token cache.

No network I/O here; `RegistryClient` asks this module what to send.

Credentials, looked up per registry (`host[:port]`), first match wins:

1. `BOOTSEER_REGISTRY_AUTH=user:password` — used for every registry;
2. a docker-style config file (`{"auths": {"host:port": {"auth": base64("user:password")}}}`,
   or `username`/`password` fields) at `BOOTSEER_REGISTRY_AUTH_FILE`, else at
   `~/.docker/config.json` if that file exists (credential helpers are not run);
3. none: anonymous.

The registry says how to authenticate in its 401 answer:

- `Basic realm=...`: send `Authorization: Basic` with the credentials;
- `Bearer realm=..,service=..,scope=..`: ask the realm for a token for the
  scope this request needs (`repository:<name>:pull`, or `pull,push` to push),
  sending the credentials as Basic auth if there are any, and send that token.
  Tokens are cached per (registry, scope) until shortly before they expire.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

AUTH_ENV = "BOOTSEER_REGISTRY_AUTH"
AUTH_FILE_ENV = "BOOTSEER_REGISTRY_AUTH_FILE"
DEFAULT_AUTH_FILE = "~/.docker/config.json"
DEFAULT_TOKEN_LIFETIME_S = 60.0  # the distribution token spec's default
TOKEN_EXPIRY_MARGIN_S = 10.0  # renew this long before the issuer's expiry
_DOCKER_HUB_KEYS = ("docker.io", "index.docker.io", "registry-1.docker.io",
                    "https://index.docker.io/v1/")


@dataclass(frozen=True, slots=True)
class Credentials:
    username: str
    password: str = field(repr=False)

    def basic_header(self) -> str:
        raw = f"{self.username}:{self.password}".encode()
        return "Basic " + base64.b64encode(raw).decode("ascii")


def parse_user_password(text: str, where: str) -> Credentials:
    user, colon, password = text.partition(":")
    if not colon or not user:
        raise ValueError(f"{where}: expected user:password")
    return Credentials(user, password)


def find_credentials(registry: str, environ: Mapping[str, str]) -> Credentials | None:
    """Credentials for `registry` by the rules in the module docstring (reads the file)."""
    if environ.get(AUTH_ENV):
        return parse_user_password(environ[AUTH_ENV], AUTH_ENV)
    explicit = environ.get(AUTH_FILE_ENV)
    path = Path(explicit or DEFAULT_AUTH_FILE).expanduser()
    if not explicit and not path.is_file():
        return None
    try:
        text = path.read_text()
    except OSError as exc:
        raise ValueError(f"cannot read registry credentials file {path}: {exc.strerror}") \
            from None
    return credentials_from_config(text, registry, str(path))


def credentials_from_config(text: str, registry: str, where: str) -> Credentials | None:
    """Credentials for `registry` from a docker-style config.json's `auths`."""
    try:
        auths = json.loads(text).get("auths", {})
    except (ValueError, AttributeError):
        raise ValueError(f"{where} is not a docker-style JSON config") from None
    if not isinstance(auths, dict):
        raise ValueError(f"{where}: 'auths' is not an object")
    keys = _DOCKER_HUB_KEYS if registry in _DOCKER_HUB_KEYS else (registry,)
    for key in keys:
        for name in (key, f"https://{key}", f"http://{key}"):
            entry = auths.get(name)
            if isinstance(entry, dict):
                return _entry_credentials(entry, f"{where} auths[{name!r}]")
    return None


def _entry_credentials(entry: dict[str, object], where: str) -> Credentials | None:
    auth = entry.get("auth")
    if isinstance(auth, str) and auth:
        try:
            decoded = base64.b64decode(auth, validate=True).decode()
        except (binascii.Error, UnicodeDecodeError):
            raise ValueError(f"{where}: 'auth' is not base64 of user:password") from None
        return parse_user_password(decoded, where)
    user, password = entry.get("username"), entry.get("password")
    if isinstance(user, str) and isinstance(password, str) and user:
        return Credentials(user, password)
    return None


@dataclass(frozen=True, slots=True)
class Challenge:
    """What a registry's 401 asked for: `scheme` is `basic` or `bearer`."""

    scheme: str
    params: tuple[tuple[str, str], ...] = ()

    def param(self, name: str) -> str | None:
        return dict(self.params).get(name)


_PARAM_RE = re.compile(r'\s*([A-Za-z][A-Za-z0-9_-]*)\s*=\s*("(?:[^"\\]|\\.)*"|[^,\s]*)\s*,?')


def parse_challenge(header: str | None) -> Challenge | None:
    """Parse a `WWW-Authenticate` header; None if absent or of an unknown scheme."""
    if not header:
        return None
    scheme, _, rest = header.strip().partition(" ")
    if scheme.lower() not in ("basic", "bearer"):
        return None
    params = []
    for match in _PARAM_RE.finditer(rest):
        value = match.group(2)
        if value.startswith('"'):
            value = re.sub(r"\\(.)", r"\1", value[1:-1])
        params.append((match.group(1).lower(), value))
    return Challenge(scheme.lower(), tuple(params))


def repository_scope(repository: str, push: bool) -> str:
    return f"repository:{repository}:{'pull,push' if push else 'pull'}"


def token_from_answer(body: bytes) -> tuple[str, float]:
    """(token, lifetime in seconds) from a token server's JSON answer."""
    try:
        doc = json.loads(body)
    except ValueError:
        raise ValueError("token server answered with something other than JSON") from None
    token = doc.get("token") or doc.get("access_token") if isinstance(doc, dict) else None
    if not isinstance(token, str) or not token:
        raise ValueError("token server answer has no token")
    lifetime = doc.get("expires_in", DEFAULT_TOKEN_LIFETIME_S)
    if not isinstance(lifetime, int | float) or lifetime <= 0:
        lifetime = DEFAULT_TOKEN_LIFETIME_S
    return token, float(lifetime)


class TokenCache:
    """Bearer tokens per (registry, scope); `now` is the caller's monotonic clock."""

    def __init__(self) -> None:
        self._tokens: dict[tuple[str, str], tuple[str, float]] = {}

    def get(self, registry: str, scope: str, now: float) -> str | None:
        entry = self._tokens.get((registry, scope))
        if entry is None or entry[1] <= now:
            return None
        return entry[0]

    def put(self, registry: str, scope: str, token: str, lifetime_s: float, now: float) -> None:
        margin = min(TOKEN_EXPIRY_MARGIN_S, lifetime_s / 2)
        self._tokens[(registry, scope)] = (token, now + lifetime_s - margin)

    def drop(self, registry: str, scope: str, token: str) -> None:
        """Forget `token` (refused by the registry) unless a newer one replaced it."""
        entry = self._tokens.get((registry, scope))
        if entry is not None and entry[0] == token:
            del self._tokens[(registry, scope)]
