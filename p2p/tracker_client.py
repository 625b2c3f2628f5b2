"""The agent's HTTP client for the tracker.

Every request is signed with the cluster secret (p2p.auth.sign_request over
method, URL path, wall time and body); manifests coming back are accepted only
with a valid body MAC, because a manifest is what every chunk is verified
against. Failures are mapped once, here, into two exceptions the agent can act
on: `TrackerUnavailable` (cannot reach it, or it timed out: retry later, fall
back to the origin meanwhile) and `TrackerError` (it answered with an error
status: a bug or a misconfiguration, such as a wrong secret).

This module must not import `tracker` (dependencies point from tracker to
p2p); `PeerInfo` mirrors the few fields of the tracker's announce reply.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
import yarl

from p2p.auth import BODY_MAC_HEADER, check_body, sign_request
from p2p.content import ContentId, Manifest, ManifestError, PeerId

REQUEST_TIMEOUT_SECONDS = 5.0


@dataclass(frozen=True, slots=True)
class PeerInfo:
    """A swarm member as the tracker hands it out."""

    peer: PeerId
    addr: str  # "host:port"
    rack: str
    have: int  # chunks held
    complete: bool


@dataclass(frozen=True, slots=True)
class AnnounceReply:
    peers: list[PeerInfo]
    interval: float  # seconds until the next announce is due
    origin_slot: int | None = None  # our index among the origin fetchers; None: not one
    origin_slots: int = 1  # how many origin fetchers the swarm has
    origin_filled: int | None = None  # how many slots have a fetcher now (None: all)


class TrackerUnavailable(Exception):
    """The tracker could not be reached or did not answer in time."""

    def __init__(self, url: str, reason: str) -> None:
        super().__init__(f"the tracker at {url} is unreachable: {reason}")
        self.url = url
        self.reason = reason


class TrackerError(Exception):
    """The tracker answered with an error status (or an unreadable reply)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"tracker replied {status}: {message}")
        self.status = status
        self.message = message


class TrackerClient:
    """Signed requests to one tracker. Pass a `session` to share its connection pool."""

    def __init__(self, base_url: str, secret: bytes,
                 session: aiohttp.ClientSession | None = None,
                 timeout_seconds: float = REQUEST_TIMEOUT_SECONDS) -> None:
        self.base_url = base_url.rstrip("/")
        self._secret = secret
        self._session = session
        self._owns_session = session is None
        self._timeout = aiohttp.ClientTimeout(total=timeout_seconds)

    async def __aenter__(self) -> TrackerClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the session if this client created it."""
        if self._owns_session and self._session is not None:
            await self._session.close()
            self._session = None

    async def announce(self, content: ContentId, peer: PeerId, addr: str, rack: str,
                       have: int, complete: bool, event: str | None = None,
                       want: int | None = None) -> AnnounceReply:
        """Join or refresh `content`'s swarm; `event="stopped"` leaves it.

        `want` caps the peers returned (0 = just a keep-alive); default: the
        tracker's handout limit.
        """
        body: dict[str, Any] = {"content": content, "peer": peer, "addr": addr, "rack": rack,
                                "have": have, "complete": complete}
        if event is not None:
            body["event"] = event
        if want is not None:
            body["want"] = want
        status, raw, _ = await self._request("POST", "/v1/announce", _encode(body))
        reply = _decode(status, raw)
        try:
            peers = [PeerInfo(PeerId(_typed(p["peer"], str)), _typed(p["addr"], str),
                              _typed(p["rack"], str), _typed(p["have"], int),
                              _typed(p["complete"], bool)) for p in reply["peers"]]
            slot, filled = reply.get("origin_slot"), reply.get("origin_filled")
            return AnnounceReply(peers, float(_typed(reply["interval"], (int, float))),
                                 None if slot is None else _typed(slot, int),
                                 max(1, _typed(reply.get("origin_slots", 1), int)),
                                 None if filled is None else _typed(filled, int))
        except (KeyError, TypeError) as exc:
            raise TrackerError(status, f"malformed announce reply: {exc!r}") from None

    async def report(self, peer: PeerId, bad_peer: PeerId, content: ContentId,
                     reason: str) -> bool:
        """Tell the tracker that `bad_peer` misbehaved towards us (`peer`) in `content`.

        True if this report got it banned from handouts.
        """
        body = {"peer": peer, "bad_peer": bad_peer, "content": content, "reason": reason}
        status, raw, _ = await self._request("POST", "/v1/report", _encode(body))
        return bool(_decode(status, raw).get("banned", False))

    async def put_manifest(self, manifest: Manifest) -> bool:
        """Publish `manifest`; True if new, False if the same one was already there."""
        path = f"/v1/manifests/{manifest.content_id}"
        status, raw, _ = await self._request("PUT", path, _encode(manifest.to_dict()))
        _decode(status, raw)
        return status == 201

    async def get_manifest(self, content_id: ContentId) -> Manifest:
        """The published manifest; AuthError unless the tracker signed it with our secret."""
        status, raw, headers = await self._request("GET", f"/v1/manifests/{content_id}", b"")
        if status != 200:
            _decode(status, raw)  # raises TrackerError with the tracker's message
        check_body(self._secret, raw, headers.get(BODY_MAC_HEADER))
        try:
            manifest = Manifest.from_dict(json.loads(raw))
        except (ValueError, ManifestError) as exc:
            raise TrackerError(status, f"malformed manifest for {content_id}: {exc}") from None
        if manifest.content_id != content_id:
            raise TrackerError(status, f"asked for {content_id}, got {manifest.content_id}")
        return manifest

    async def _request(self, method: str, path: str,
                       body: bytes) -> tuple[int, bytes, Mapping[str, str]]:
        url = yarl.URL(self.base_url + path)
        headers = sign_request(self._secret, method, url.path, body, time.time())
        headers["Content-Type"] = "application/json"
        if self._session is None:
            self._session = aiohttp.ClientSession()
        try:
            async with self._session.request(method, url, data=body, headers=headers,
                                             timeout=self._timeout) as resp:
                return resp.status, await resp.read(), resp.headers
        except TimeoutError as exc:  # before OSError, of which it is a subclass
            raise TrackerUnavailable(
                self.base_url, f"no answer within {self._timeout.total:g} s") from exc
        except (aiohttp.ClientError, OSError) as exc:
            raise TrackerUnavailable(self.base_url, str(exc) or type(exc).__name__) from exc


def _encode(payload: dict[str, Any]) -> bytes:
    return json.dumps(payload, separators=(",", ":")).encode()


def _decode(status: int, raw: bytes) -> dict[str, Any]:
    """The JSON object of a 2xx reply; TrackerError for any other status or shape."""
    try:
        value = json.loads(raw)
    except ValueError:
        value = None
    if not 200 <= status < 300:
        message = value.get("error") if isinstance(value, dict) else None
        raise TrackerError(status, str(message or raw[:200].decode(errors="replace")))
    if not isinstance(value, dict):
        raise TrackerError(status, "reply is not a JSON object")
    return value


def _typed(value: Any, kind: type | tuple[type, ...]) -> Any:
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        raise TypeError(f"expected {kind}, got {type(value).__name__}")
    return value
