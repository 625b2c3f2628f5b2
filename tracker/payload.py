"""The JSON in and out of the tracker's views: request bodies checked field by field.

A body is untrusted until proven otherwise (tracker.guard has already checked
its signature and read it, bounded): it must be a JSON object, every field a
view reads must be present and of its type, text printable and bounded, and
every content id well formed (p2p.content.check_content_id). Each check
raises `BadRequest` naming the field and the problem, which the app maps to a
400. The views import this module and call its checks by name
(`payload.text(body, "peer")`), and answer with `payload.reply`. JSON goes
through orjson both ways: at thousands of announces a second the standard
library's encoder and decoder were a tenth of the tracker's time.
"""

from __future__ import annotations

import ipaddress
from typing import Any

import orjson
from aiohttp import web

from p2p.content import ContentId, ManifestError, check_content_id
from p2p.wire import normal_ip
from tracker.guard import BadRequest, cached_normal_ip

MAX_ID_CHARS = 256


def json_object(body: bytes) -> dict[str, Any]:
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError as exc:  # also absurdly deep nesting, NaN, 65-bit ints
        raise BadRequest(f"body is not valid JSON: {str(exc)[:200]}") from None
    if not isinstance(value, dict):
        raise BadRequest(f"body must be a JSON object, not {type(value).__name__}")
    return value


def field(obj: dict[str, Any], name: str, kind: type, within: str = "") -> Any:
    """`obj[name]` if present and of `kind`; `within` prefixes the name in errors
    ("contents.c1-....": a field of one content of a batched announce)."""
    if name not in obj:
        raise BadRequest(f'missing field "{within}{name}"')
    value = obj[name]
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        raise BadRequest(f'field "{within}{name}" must be {kind.__name__}, '
                         f"not {type(value).__name__}")
    return value


def text(obj: dict[str, Any], name: str, max_chars: int = MAX_ID_CHARS,
         empty_ok: bool = False) -> str:
    value: str = field(obj, name, str)
    if not value and not empty_ok:
        raise BadRequest(f'field "{name}" must not be empty')
    if len(value) > max_chars or not value.isprintable():
        raise BadRequest(f'field "{name}" must be printable and at most {max_chars} characters')
    return value


def content_id(value: object, where: str) -> ContentId:
    try:
        return check_content_id(value)
    except ManifestError as exc:
        raise BadRequest(f"{where}: {exc}") from None


def addr(obj: dict[str, Any]) -> tuple[str, str]:
    """The `addr` field as (host, port), the host normalised."""
    given = text(obj, "addr")
    host, _, port = given.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise BadRequest(f'field "addr" must be "host:port", not {given!r}')
    return cached_normal_ip(host), port


def seen_at(obj: dict[str, Any]) -> str | None:
    """A report's optional `addr`: the IP (or "IP:port") the offender was seen at."""
    if obj.get("addr") is None:
        return None
    given = text(obj, "addr")
    host = _ip(given) or _ip(given.rpartition(":")[0])
    if host is None:
        raise BadRequest(f'field "addr" must be the IP address (or "IP:port") the peer was '
                         f"seen at, not {given[:80]!r}")
    return host


def _ip(given: str) -> str | None:
    try:
        return normal_ip(str(ipaddress.ip_address(given.strip("[]"))))
    except ValueError:
        return None


def count(obj: dict[str, Any], name: str, maximum: int, within: str = "") -> int:
    value: int = field(obj, name, int, within)
    if not 0 <= value <= maximum:
        raise BadRequest(f'field "{within}{name}" must be in 0..{maximum}, not {value}')
    return value


def reply(value: object, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(value), status=status, content_type="application/json")

