"""Cluster authentication: one shared secret, HMAC-SHA256 everywhere.

Peers prove knowledge of the secret in the wire handshake (challenge and
response, both directions), and agents sign their HTTP requests to the
tracker; the tracker signs the manifests it returns. A process without the
secret can neither fetch nor serve, and cannot register content or peers.

The secret comes from `BOOTSEER_SECRET`, or a file named by
`BOOTSEER_SECRET_FILE` or by configuration. Nothing here reads a clock: the
caller passes `now` so that replay windows are testable.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Mapping
from pathlib import Path

MIN_SECRET_BYTES = 16
MAX_CLOCK_SKEW_SECONDS = 300.0
AUTH_HEADER = "X-Bootseer-Auth"
TIME_HEADER = "X-Bootseer-Time"
BODY_MAC_HEADER = "X-Bootseer-Body-Mac"


class AuthError(Exception):
    """The other side did not prove it holds the cluster secret."""


class SecretError(Exception):
    """No usable cluster secret is configured."""


def load_secret(path: str | None = None) -> bytes:
    """The cluster secret from `path`, `BOOTSEER_SECRET_FILE` or `BOOTSEER_SECRET`."""
    path = path or os.environ.get("BOOTSEER_SECRET_FILE")
    if path:
        try:
            secret = Path(path).read_bytes().strip()
        except OSError as exc:
            raise SecretError(f"cannot read cluster secret file {path}: {exc.strerror}") from exc
    else:
        secret = os.environ.get("BOOTSEER_SECRET", "").encode()
    if len(secret) < MIN_SECRET_BYTES:
        raise SecretError(
            f"the cluster secret must be at least {MIN_SECRET_BYTES} bytes; set BOOTSEER_SECRET "
            "or BOOTSEER_SECRET_FILE (e.g. `head -c 32 /dev/urandom | base64 > secret`)"
        )
    return secret


def _mac(secret: bytes, *parts: bytes) -> bytes:
    mac = hmac.new(secret, digestmod=hashlib.sha256)
    for part in parts:
        mac.update(len(part).to_bytes(4, "big"))
        mac.update(part)
    return mac.digest()


def handshake_mac(secret: bytes, role: str, nonce_a: bytes, nonce_b: bytes, peer_a: str,
                  peer_b: str) -> bytes:
    """Proof that `peer_a`, in `role` ("server" or "client"), holds the secret."""
    return _mac(secret, b"bootseer-wire-v1", role.encode(), nonce_a, nonce_b,
                peer_a.encode(), peer_b.encode())


def check_handshake_mac(expected: bytes, got: object) -> None:
    if not isinstance(got, bytes) or not hmac.compare_digest(expected, got):
        raise AuthError("peer failed the cluster-secret handshake")


def sign_request(secret: bytes, method: str, path: str, body: bytes, now: float) -> dict[str, str]:
    """Headers that authenticate one HTTP request to the tracker."""
    stamp = f"{now:.3f}"
    mac = _mac(secret, b"bootseer-http-v1", method.upper().encode(), path.encode(),
               stamp.encode(), body)
    return {AUTH_HEADER: mac.hex(), TIME_HEADER: stamp}


def check_request(secret: bytes, method: str, path: str, body: bytes,
                  headers: Mapping[str, str], now: float) -> None:
    """Raise AuthError unless the request carries a fresh, valid signature."""
    mac_hex, stamp = headers.get(AUTH_HEADER), headers.get(TIME_HEADER)
    if not mac_hex or not stamp:
        raise AuthError(f"missing {AUTH_HEADER}/{TIME_HEADER} headers")
    try:
        when = float(stamp)
        got = bytes.fromhex(mac_hex)
    except ValueError as exc:
        raise AuthError("malformed authentication headers") from exc
    if abs(now - when) > MAX_CLOCK_SKEW_SECONDS:
        raise AuthError(f"request time is {now - when:.0f}s off the tracker's clock")
    expected = _mac(secret, b"bootseer-http-v1", method.upper().encode(), path.encode(),
                    stamp.encode(), body)
    if not hmac.compare_digest(expected, got):
        raise AuthError("bad request signature (wrong cluster secret?)")


def sign_body(secret: bytes, body: bytes) -> str:
    """MAC of a response body, so an agent can trust a manifest from the tracker."""
    return _mac(secret, b"bootseer-body-v1", body).hex()


def check_body(secret: bytes, body: bytes, mac_hex: str | None) -> None:
    if not mac_hex or not hmac.compare_digest(sign_body(secret, body), mac_hex):
        raise AuthError("response is not signed with the cluster secret")
