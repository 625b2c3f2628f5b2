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
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from p2p.errors import RemoteError, UserError

MIN_SECRET_BYTES = 16
MAX_CLOCK_SKEW_SECONDS = 300.0
AUTH_HEADER = "X-Bootseer-Auth"
TIME_HEADER = "X-Bootseer-Time"
BODY_MAC_HEADER = "X-Bootseer-Body-Mac"
_MAC_HEX = re.compile(r"[0-9a-fA-F]{64}")
_STAMP = re.compile(r"[0-9]{1,12}(\.[0-9]{1,9})?")


class AuthError(RemoteError):
    """The other side did not prove it holds the cluster secret."""


class SecretError(UserError):
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
    """Headers that authenticate one HTTP request to the tracker.

    The stamp has microseconds, so two requests with the same method, path and
    body signed at different moments never share a MAC (the tracker refuses a
    MAC it has already seen, as a replay).
    """
    stamp = f"{now:.6f}"
    mac = _mac(secret, b"bootseer-http-v1", method.upper().encode(), path.encode(),
               stamp.encode(), body)
    return {AUTH_HEADER: mac.hex(), TIME_HEADER: stamp}


@dataclass(frozen=True, slots=True)
class SignedHeaders:
    """The authentication headers of a request, well-formed and fresh, not yet verified."""

    stamp: str  # exactly as sent: it is part of the MAC
    when: float  # the stamp as seconds since the epoch, finite
    mac: bytes


def check_request_headers(headers: Mapping[str, str], now: float,
                          max_skew_seconds: float = MAX_CLOCK_SKEW_SECONDS) -> SignedHeaders:
    """The request's signature headers if present, well-formed and fresh; else AuthError.

    Needs no body, so a server can refuse an unsigned or stale request before
    reading a byte of its body. A stamp is plain decimal seconds (no sign,
    exponent, "nan" or "inf"), so it is always finite and comparable.
    """
    mac_hex, stamp = headers.get(AUTH_HEADER), headers.get(TIME_HEADER)
    if not mac_hex or not stamp:
        raise AuthError(f"missing {AUTH_HEADER}/{TIME_HEADER} headers")
    if not _MAC_HEX.fullmatch(mac_hex) or not _STAMP.fullmatch(stamp):
        raise AuthError(f"malformed authentication headers: {AUTH_HEADER} must be 64 hex "
                        f"digits and {TIME_HEADER} decimal seconds since the epoch")
    when = float(stamp)
    if not math.isfinite(when) or abs(now - when) > max_skew_seconds:
        raise AuthError(f"request time is {now - when:.0f}s off the tracker's clock "
                        f"(at most {max_skew_seconds:.0f}s allowed)")
    return SignedHeaders(stamp, when, bytes.fromhex(mac_hex))


def verify_request(secret: bytes, method: str, path: str, body: bytes,
                   signed: SignedHeaders) -> None:
    """Raise AuthError unless `signed` is the MAC of this request under `secret`."""
    expected = _mac(secret, b"bootseer-http-v1", method.upper().encode(), path.encode(),
                    signed.stamp.encode(), body)
    if not hmac.compare_digest(expected, signed.mac):
        raise AuthError("bad request signature (wrong cluster secret?)")


def check_request(secret: bytes, method: str, path: str, body: bytes,
                  headers: Mapping[str, str], now: float) -> SignedHeaders:
    """The checked headers if the request carries a fresh, valid signature; else AuthError."""
    signed = check_request_headers(headers, now)
    verify_request(secret, method, path, body, signed)
    return signed


def sign_body(secret: bytes, body: bytes) -> str:
    """MAC of a response body, so an agent can trust a manifest from the tracker."""
    return _mac(secret, b"bootseer-body-v1", body).hex()


def check_body(secret: bytes, body: bytes, mac_hex: str | None) -> None:
    if not mac_hex or not hmac.compare_digest(sign_body(secret, body), mac_hex):
        raise AuthError("response is not signed with the cluster secret")
