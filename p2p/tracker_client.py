"""The agent's HTTP client for the tracker.

Every request is signed with the cluster secret (p2p.auth.sign_request over
method, URL path, wall time and body); manifests coming back are accepted only
with a valid body MAC, because a manifest is what every chunk is verified
against. Failures are mapped once, here, into two exceptions the agent can act
on: `TrackerUnavailable` (cannot reach it, or it timed out: retry later, fall
back to the origin meanwhile) and `TrackerError` (it answered with an error
status: a bug or a misconfiguration, such as a wrong secret).

Every content id is checked (p2p.content.check_content_id) and every name
(`check_name`) before it goes into a URL, and both are quoted, so no id from
outside can make us send a request for another path. With `bind_host` (the
agent's configured address, when it is a specific one) every connection to
the tracker leaves from that address: the tracker knows a node by the address
it is seen at, and binds its peer id to it.

Replicas. `base_url` may list several tracker URLs, comma-separated (the
replicas of one cluster, tracker.replicas): a request goes to the one that
answered last, and when it cannot be reached or answers 503 (its Redis is
down, or it is at its connection cap) the same request goes to the next, at
once. So an agent fails over within the announce that found its tracker gone.

This module must not import `tracker` (dependencies point from tracker to
p2p); `PeerInfo` mirrors the few fields of the tracker's announce reply.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
import yarl

from p2p.auth import BODY_MAC_HEADER, check_body, sign_request
from p2p.content import ContentId, Manifest, ManifestError, PeerId, check_content_id
from p2p.errors import RemoteError

REQUEST_TIMEOUT_SECONDS = 5.0
KEEPALIVE_SECONDS = 10.0  # below the tracker's idle limit, so it is us who close first
UNREACHABLE = "unreachable"  # report reason: we could not dial that peer (frees its slot)
UNSPECIFIED_HOSTS = ("", "0.0.0.0", "::")
MAX_NAME_CHARS = 255
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@+=~/-]{0,254}")


def check_name(text: object) -> str:
    """`text` if it is a well-formed content name (the tracker's rule); else ValueError."""
    if (not isinstance(text, str) or not _NAME.fullmatch(text)
            or any(s in ("", ".", "..") for s in text.split("/"))):
        shown = text[:80] if isinstance(text, str) else type(text).__name__
        raise ValueError(f"name {shown!r} must be 1..{MAX_NAME_CHARS} characters of "
                         "A-Z a-z 0-9 . _ : @ + = ~ / -, start with a letter or digit, and "
                         "have no empty, '.' or '..' segment")
    return text


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


@dataclass(frozen=True, slots=True)
class ContentState:
    """What a node tells the tracker about one content in an announce."""

    content: ContentId
    have: int  # chunks held
    complete: bool
    event: str | None = None  # "started", "completed", "stopped" (leave the swarm)
    want: int | None = None  # peers wanted; 0 = none; None = the tracker's handout limit
    origin_bytes: int = 0  # fetched from the origin so far (the tracker's status page)


FAILOVER_PAUSE_S = 0.5  # replicas: before the second round of a request none answered


class TrackerUnavailable(RemoteError):
    """The tracker could not be reached or did not answer in time."""

    def __init__(self, url: str, reason: str) -> None:
        super().__init__(f"the tracker at {url} is unreachable: {reason}")
        self.url = url
        self.reason = reason


class TrackerError(RemoteError):
    """The tracker answered with an error status (or an unreadable reply)."""

    def __init__(self, status: int, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(f"tracker replied {status}: {message}")
        self.status = status
        self.message = message
        self.retry_after_s = retry_after_s  # with a 429: when to try again


class TrackerClient:
    """Signed requests to a tracker (or its replicas, failing over; see the module docstring).

    Pass a `session` to share its connection pool.
    """

    def __init__(self, base_url: str, secret: bytes,
                 session: aiohttp.ClientSession | None = None,
                 timeout_seconds: float = REQUEST_TIMEOUT_SECONDS,
                 bind_host: str | None = None) -> None:
        self.urls = [u.strip().rstrip("/") for u in base_url.split(",") if u.strip()]
        if not self.urls:
            raise ValueError("no tracker URL given")
        self._current = 0  # the replica that answered last
        self._secret = secret
        self._session = session
        self._bind = (None if bind_host is None or bind_host in UNSPECIFIED_HOSTS
                      else (bind_host.strip("[]"), 0))
        self._owns_session = session is None
        self._timeout = aiohttp.ClientTimeout(total=timeout_seconds)

    @property
    def base_url(self) -> str:
        """The tracker URL in use: the one that answered last."""
        return self.urls[self._current]

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
        tracker's handout limit. One content of `announce_all`.
        """
        state = ContentState(content, have, complete, event, want)
        return (await self.announce_all(peer, addr, rack, [state]))[content]

    async def announce_all(self, peer: PeerId, addr: str, rack: str,
                           contents: Sequence[ContentState]) -> dict[ContentId, AnnounceReply]:
        """One announce for all of a node's `contents`: each content's reply by id.

        Peers come back only for contents whose `want` is not 0.
        """
        states: dict[str, Any] = {}
        for c in contents:
            state: dict[str, Any] = {"have": c.have, "complete": c.complete}
            if c.origin_bytes:
                state["origin_bytes"] = c.origin_bytes
            if c.event is not None:
                state["event"] = c.event
            if c.want is not None:
                state["want"] = c.want
            states[check_content_id(c.content)] = state
        body = {"peer": peer, "addr": addr, "rack": rack, "contents": states}
        status, raw, _ = await self._request("POST", "/v1/announce", _encode(body))
        reply = _decode(status, raw)
        try:
            interval = float(_typed(reply["interval"], (int, float)))
            got = _typed(reply["contents"], dict)
            return {c.content: _content_reply(_typed(got[c.content], dict), interval)
                    for c in contents}
        except (KeyError, TypeError) as exc:
            raise TrackerError(status, f"malformed announce reply: {exc!r}") from None

    async def report(self, peer: PeerId, bad_peer: PeerId, content: ContentId,
                     reason: str, addr: str | None = None) -> bool:
        """Tell the tracker that `bad_peer` misbehaved towards us (`peer`) in `content`.

        `addr` is the IP we saw it at (the tracker bans that address, not the
        name it claimed); reason `UNREACHABLE` says we could not dial it (not a
        ban: it frees its origin-fetcher slot). True if this report got it
        banned from handouts.
        """
        body = {"peer": peer, "bad_peer": bad_peer, "content": check_content_id(content),
                "reason": reason}
        if addr is not None:
            body["addr"] = addr
        status, raw, _ = await self._request("POST", "/v1/report", _encode(body))
        return bool(_decode(status, raw).get("banned", False))

    async def put_manifest(self, manifest: Manifest) -> bool:
        """Publish `manifest`; True if new, False if the same one was already there."""
        path = f"/v1/manifests/{_quoted(check_content_id(manifest.content_id))}"
        status, raw, _ = await self._request("PUT", path, _encode(manifest.to_dict()))
        _decode(status, raw)
        return status == 201

    async def get_manifest(self, content_id: ContentId) -> Manifest:
        """The published manifest; AuthError unless the tracker signed it with our secret."""
        path = f"/v1/manifests/{_quoted(check_content_id(content_id))}"
        raw = await self._signed_get(path)
        try:
            manifest = Manifest.from_dict(json.loads(raw))
        except (ValueError, ManifestError) as exc:
            raise TrackerError(200, f"malformed manifest for {content_id}: {exc}") from None
        if manifest.content_id != content_id:
            raise TrackerError(200, f"asked for {content_id}, got {manifest.content_id}")
        return manifest

    async def put_name(self, name: str, content_id: ContentId) -> bool:
        """Name a published content; True if new, False if it already had this name.

        TrackerError 409 if the name is taken by another content (names never
        change), 404 if no manifest is published as `content_id`.
        """
        path = f"/v1/names/{_quoted(check_name(name))}"
        body = _encode({"content_id": check_content_id(content_id)})
        status, raw, _ = await self._request("PUT", path, body)
        _decode(status, raw)
        return status == 201

    async def get_name(self, name: str) -> ContentId:
        """The content a name stands for; AuthError unless the tracker signed the answer."""
        raw = await self._signed_get(f"/v1/names/{_quoted(check_name(name))}")
        try:
            reply = json.loads(raw)
            got, content_id = reply["name"], check_content_id(reply["content_id"])
        except (ValueError, TypeError, KeyError) as exc:  # ManifestError is a ValueError
            raise TrackerError(200, f"malformed name reply for {name!r}: {exc!r}") from None
        if got != name:
            raise TrackerError(200, f"asked for the name {name!r}, got {got!r}")
        return content_id

    async def _signed_get(self, path: str) -> bytes:
        """The body of a 200 reply to a signed GET, once its body MAC checks out."""
        status, raw, headers = await self._request("GET", path, b"")
        if status != 200:
            _decode(status, raw)  # raises TrackerError with the tracker's message
        check_body(self._secret, raw, headers.get(BODY_MAC_HEADER))
        return raw

    async def _request(self, method: str, path: str,
                       body: bytes) -> tuple[int, bytes, Mapping[str, str]]:
        """The reply of the first replica, from the current one on, that is up (not 503).
        With replicas, a round in which none answered is tried once more after a short
        pause: while one replica dies, another can refuse a connection for a moment."""
        rounds = 2 if len(self.urls) > 1 else 1
        for round_ in range(rounds):
            for _ in range(len(self.urls) - 1):
                try:
                    reply = await self._request_one(self.base_url, method, path, body)
                    if reply[0] != 503:
                        return reply
                except TrackerUnavailable:
                    pass
                self._current = (self._current + 1) % len(self.urls)
            try:
                return await self._request_one(self.base_url, method, path, body)
            except TrackerUnavailable:
                if round_ == rounds - 1:
                    raise
                self._current = (self._current + 1) % len(self.urls)
                await asyncio.sleep(FAILOVER_PAUSE_S)
        raise AssertionError("unreachable")

    async def _request_one(self, base_url: str, method: str, path: str,
                           body: bytes) -> tuple[int, bytes, Mapping[str, str]]:
        url = yarl.URL(base_url + path, encoded=True)
        headers = sign_request(self._secret, method, url.path, body, time.time())
        headers["Content-Type"] = "application/json"
        if self._session is None:
            connector = aiohttp.TCPConnector(local_addr=self._bind,
                                             keepalive_timeout=KEEPALIVE_SECONDS)
            self._session = aiohttp.ClientSession(connector=connector)
        try:
            async with self._session.request(method, url, data=body, headers=headers,
                                             timeout=self._timeout) as resp:
                raw = await resp.read()
                if resp.status == 429:
                    raise _rate_limited(raw, resp.headers)
                return resp.status, raw, resp.headers
        except TimeoutError as exc:  # before OSError, of which it is a subclass
            raise TrackerUnavailable(
                base_url, f"no answer within {self._timeout.total:g} s") from exc
        except (aiohttp.ClientError, OSError) as exc:
            raise TrackerUnavailable(base_url, str(exc) or type(exc).__name__) from exc


def _content_reply(reply: dict[str, Any], interval: float) -> AnnounceReply:
    """One content's part of an announce reply; KeyError or TypeError if malformed."""
    peers = [PeerInfo(PeerId(_typed(p["peer"], str)), _typed(p["addr"], str),
                      _typed(p["rack"], str), _typed(p["have"], int),
                      _typed(p["complete"], bool)) for p in reply.get("peers", [])]
    slot, filled = reply.get("origin_slot"), reply.get("origin_filled")
    return AnnounceReply(peers, interval, None if slot is None else _typed(slot, int),
                         max(1, _typed(reply.get("origin_slots", 1), int)),
                         None if filled is None else _typed(filled, int))


def _quoted(segment: str) -> str:
    """A checked id or name, percent-encoded for a URL path (`/` kept: names have it)."""
    return urllib.parse.quote(segment, safe="/")


def _rate_limited(raw: bytes, headers: Mapping[str, str]) -> TrackerError:
    try:
        retry = float(headers.get("Retry-After", "1"))
    except ValueError:
        retry = 1.0
    try:
        message = str(json.loads(raw)["error"])
    except (ValueError, TypeError, KeyError):
        message = "too many requests"
    return TrackerError(429, message, retry_after_s=retry)


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
