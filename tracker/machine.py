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
from typing import Any

import msgpack

from p2p.content import ContentId, PeerId
from tracker.handout import HandoutPolicy
from tracker.registry import Member, Registry

UNREACHABLE = "unreachable"  # a report reason: could not dial the peer (frees its slot)
STOPPED: dict[str, Any] = {"peers": [], "origin_slot": None, "origin_slots": 1, "origin_filled": 1}


@dataclass(frozen=True, slots=True)
class ContentAnnounce:
    """One content of an announce, checked."""

    content: ContentId
    have: int
    complete: bool
    want: int
    event: str | None
    origin_bytes: int = 0


@dataclass(frozen=True, slots=True)
class Announce:
    """A node's announce of all its contents; `addr` is None when it stops them all."""

    peer: PeerId
    host: str  # the address the request came from
    addr: str | None  # "host:port" it serves chunks at
    rack: str
    items: tuple[ContentAnnounce, ...]


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
                reg.leave(item.content, op.peer, op.host)
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
            return STOPPED
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
                            host=op.seen_at, reporter_host=op.host)
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
    """The op of a log entry; ValueError if it is not one `encode` wrote."""
    try:
        value = msgpack.unpackb(raw)
        kind, *fields = value
        if kind == "a":
            peer, host, addr, rack, items = fields
            return Announce(PeerId(peer), host, addr, rack, tuple(
                ContentAnnounce(ContentId(c), have, complete, want, event, origin)
                for c, have, complete, want, event, origin in items))
        if kind == "r":
            reporter, bad, content, reason, host, seen_at = fields
            return Report(PeerId(reporter), PeerId(bad), ContentId(content), reason, host,
                          seen_at)
        if kind == "t" and not fields:
            return Tick()
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise ValueError(f"not a tracker log entry: {exc}") from None
    raise ValueError(f"not a tracker log entry: kind {str(value[0])[:20]!r}")
