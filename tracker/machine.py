"""The tracker as a state machine: every change to swarm state is an `Op`.

Theory of operation. Three kinds of op change what the registry holds: a
node's `Announce` (all its contents at once), a `Report` about a peer, and a
`Tick` (expire silent members). `Machine.apply(op, now, rng)` applies one op
and returns what the caller answers with: each announced content's peers and
origin slot, or whether a report banned its target, or the members that
expired. Everything that can be refused without looking at the state (a
malformed field, a bad signature, an address that is not the sender's) is
refused by the views before an op exists; the one refusal that needs the
state, an `IdentityError` (a peer id bound to another address), is raised by
`apply` before anything changes.

The op is the unit of replication. One tracker process applies ops as they
arrive, on its own clock and rng (`tracker.state.LocalCore`). Replicas append
ops to one ordered log in Redis and every replica applies the whole log, in
order, with `now` taken from the log entry and the rng seeded from the
entry's id (`tracker.replicas`); so all replicas hold the same registry, hand
out the same peers and appoint the same origin fetchers as one process fed
the same ops would. That is why `apply` must stay deterministic: no clock,
no global random, no iteration of a set. `encode` and `decode` give an op's
log form (msgpack).

A replica applies the ops of other replicas only for their effect on the
state: with `rng=None`, `apply` skips the handouts (the one costly part of an
announce) and returns nothing for them.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Final

import msgpack

from p2p.content import ContentId, PeerId, check_content_id
from tracker.handout import HandoutPolicy
from tracker.registry import Member, Registry

UNREACHABLE: Final = "unreachable"  # a report reason: could not dial the peer (frees its slot)


@dataclass(frozen=True, slots=True, init=False)
class ContentAnnounce:
    """One content of an announce, checked."""

    content: ContentId
    have: int
    complete: bool
    want: int
    event: str | None
    origin_bytes: int = 0

    def __init__(self, content: ContentId, have: int, complete: bool, want: int,
                 event: str | None, origin_bytes: int = 0) -> None:
        object.__setattr__(self, "content", content)
        object.__setattr__(self, "have", have)
        object.__setattr__(self, "complete", complete)
        object.__setattr__(self, "want", want)
        object.__setattr__(self, "event", event)
        object.__setattr__(self, "origin_bytes", origin_bytes)


@dataclass(frozen=True, slots=True, init=False)
class Announce:
    """A node's announce of all its contents; `addr` is None when it stops them all."""

    peer: PeerId
    host: str  # the address the request came from
    addr: str | None  # "host:port" it serves chunks at
    rack: str
    items: tuple[ContentAnnounce, ...]

    def __init__(self, peer: PeerId, host: str, addr: str | None, rack: str,
                 items: tuple[ContentAnnounce, ...]) -> None:
        object.__setattr__(self, "peer", peer)
        object.__setattr__(self, "host", host)
        object.__setattr__(self, "addr", addr)
        object.__setattr__(self, "rack", rack)
        object.__setattr__(self, "items", items)


@dataclass(frozen=True, slots=True)
class Report:
    """`reporter` (at `host`) says `bad` misbehaved in `content`, seen at `seen_at`."""

    reporter: PeerId
    bad: PeerId
    content: ContentId
    reason: str
    host: str
    seen_at: str | None


@dataclass(frozen=True, slots=True)
class Tick:
    """Time passed: drop the members silent for longer than the TTL."""


Op = Announce | Report | Tick


@dataclass(frozen=True, slots=True)
class ReportResult:
    banned: bool  # this report got the peer's address banned from handouts
    freed: bool  # an "unreachable" report freed the peer's origin slot


class Machine:
    """The registry, the handout policy and the TTL; see the module docstring."""

    def __init__(self, registry: Registry, policy: HandoutPolicy, peer_ttl: float) -> None:
        self.registry = registry
        self.policy = policy
        self.peer_ttl = peer_ttl

    def apply(self, op: Op, now: float, rng: random.Random | None) -> Any:
        """Apply `op` at `now`; its reply (see the module docstring). IdentityError: no change."""
        if isinstance(op, Announce):
            return self._announce(op, now, rng)
        if isinstance(op, Report):
            return self._report(op, now)
        return self.registry.expire(now, self.peer_ttl)

    def _announce(self, op: Announce, now: float,
                  rng: random.Random | None) -> dict[ContentId, dict[str, Any]] | None:
        reg = self.registry
        reg.check_identity(op.peer, op.host)  # before any change, for the whole batch
        for item in op.items:
            if item.event == "stopped" or op.addr is None:
                reg.leave(item.content, op.peer, op.host, now)
            else:
                reg.announce(item.content, Member(op.peer, op.addr, op.rack, item.have,
                                                  item.complete, now, op.host,
                                                  item.origin_bytes), now)
        if rng is None:
            return None
        return {item.content: self._reply(op, item, now, rng) for item in op.items}

    def _reply(self, op: Announce, item: ContentAnnounce, now: float,
               rng: random.Random) -> dict[str, Any]:
        if item.event == "stopped" or op.addr is None:
            # A new dict each time, as every reply: the caller's to change.
            return {"peers": [], "origin_slot": None, "origin_slots": 1, "origin_filled": 1}
        peers = []
        if item.want:
            handed = self.policy(op.peer, op.rack, self.registry.candidates(item.content, now),
                                 item.want, rng)
            peers = [{"peer": m.peer, "addr": m.addr, "rack": m.rack, "have": m.have,
                      "complete": m.complete} for m in handed]
        slot = self.registry.origin_slot(item.content, op.peer)
        return {"peers": peers, "origin_slot": slot.slot, "origin_slots": slot.slots,
                "origin_filled": slot.filled}

    def _report(self, op: Report, now: float) -> ReportResult:
        reg = self.registry
        if op.reason == UNREACHABLE:
            reg.reporter_node(op.reporter, op.host)  # only members may say so
            return ReportResult(False, reg.fetcher_unreachable(op.content, op.bad))
        banned = reg.report(op.bad, op.reporter, f"{op.content}: {op.reason}", now,
                            host=op.seen_at, reporter_host=op.host, content=op.content)
        return ReportResult(banned, False)


# -- the log form ---------------------------------------------------------------------


def encode(op: Op) -> bytes:
    """`op` as the bytes of a log entry."""
    if isinstance(op, Announce):
        items = [[i.content, i.have, i.complete, i.want, i.event, i.origin_bytes]
                 for i in op.items]
        return _pack(["a", op.peer, op.host, op.addr, op.rack, items])
    if isinstance(op, Report):
        return _pack(["r", op.reporter, op.bad, op.content, op.reason, op.host, op.seen_at])
    return _pack(["t"])


def _pack(value: list[Any]) -> bytes:
    packed: bytes = msgpack.packb(value)
    return packed


def decode(raw: bytes) -> Op:
    """The op of a log entry; ValueError if it is not one `encode` could have written.

    The log lives in Redis, outside the tracker: every field is checked for its
    type and range here, so that a malformed entry is refused as a whole
    before `apply` sees it (an entry that `apply` could trip over would stop
    every replica at the same place, for good).
    """
    if len(raw) > MAX_ENTRY_BYTES:
        raise ValueError(f"not a tracker log entry: {len(raw)} bytes")
    try:
        value = msgpack.unpackb(raw)
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise ValueError(f"not a tracker log entry: {exc}") from None
    if not isinstance(value, list) or not value:
        raise ValueError(f"not a tracker log entry: a {type(value).__name__}, not a list")
    kind, fields = value[0], value[1:]
    if kind == "a" and len(fields) == 5:
        peer, host, addr, rack, items = fields
        if not isinstance(items, list) or len(items) > MAX_ITEMS:
            raise ValueError(f"not a tracker log entry: announce items {_shown(items)}")
        return Announce(_peer(peer), _text(host, "host"), _optional(addr, "addr"),
                        _text(rack, "rack", empty_ok=True),
                        tuple(_content_announce(item) for item in items))
    if kind == "r" and len(fields) == 6:
        reporter, bad, content, reason, host, seen_at = fields
        return Report(_peer(reporter), _peer(bad), _content(content),
                      _text(reason, "reason", empty_ok=True, limit=MAX_REASON), _text(host, "host"),
                      _optional(seen_at, "seen_at"))
    if kind == "t" and not fields:
        return Tick()
    raise ValueError(f"not a tracker log entry: kind {_shown(kind)} with {len(fields)} fields")


MAX_ENTRY_BYTES = 1 << 20  # a 256-content announce is ~40 KB
MAX_ITEMS = 256  # tracker.announce.MAX_CONTENTS
MAX_TEXT = 256  # tracker.payload.MAX_ID_CHARS
MAX_REASON = 1024  # tracker.app.MAX_REASON_CHARS
MAX_COUNT = 2**62
EVENTS = (None, "started", "completed", "stopped")


def _content_announce(item: object) -> ContentAnnounce:
    if not isinstance(item, list) or len(item) != 6:
        raise ValueError(f"not a tracker log entry: announce item {_shown(item)}")
    content, have, complete, want, event, origin = item
    if not isinstance(complete, bool) or event not in EVENTS:
        raise ValueError(f"not a tracker log entry: complete {_shown(complete)}, "
                         f"event {_shown(event)}")
    return ContentAnnounce(_content(content), _count(have, "have"), complete,
                           _count(want, "want"), event, _count(origin, "origin_bytes"))


def _text(value: object, name: str, empty_ok: bool = False, limit: int = MAX_TEXT) -> str:
    if not isinstance(value, str) or len(value) > limit or (not value and not empty_ok):
        raise ValueError(f"not a tracker log entry: {name} {_shown(value)}")
    return value


def _optional(value: object, name: str) -> str | None:
    return None if value is None else _text(value, name)


def _peer(value: object) -> PeerId:
    return PeerId(_text(value, "peer id"))


def _content(value: object) -> ContentId:
    try:
        return check_content_id(value)
    except ValueError as exc:
        raise ValueError(f"not a tracker log entry: {exc}") from None


def _count(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_COUNT:
        raise ValueError(f"not a tracker log entry: {name} {_shown(value)}")
    return value


def _shown(value: object) -> str:
    return repr(value)[:40]
