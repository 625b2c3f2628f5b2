"""Events into the swarm core and actions out of it.

Events are facts in the past tense, reported by whoever drives the core (the
asyncio agent or the simulator). Actions are requests in the imperative that
the driver must carry out; their results come back later as events. All are
small frozen values, so a run can be logged and replayed.

`source=None` on a chunk event means the origin, not a peer.

Each value with fields spells out its `__init__` (`init=False`), setting the
fields with `object.__setattr__` as a frozen dataclass's own does: in the
simulator's compiled engine mypyc makes that a native constructor storing
straight into the value, while the `__init__` dataclasses generates runs as
Python there (about 1 us a value, 16x the native one, millions of values a
run). Equality, hashing, `repr`, `match` and the frozen check are still the
dataclass's; tests/p2p/test_values.py checks that every written `__init__`
takes the fields in order, with their defaults. p2p.swarm.node and
p2p.swarm.links, and the tracker's hottest values, do the same.
"""

from __future__ import annotations

from dataclasses import dataclass

from p2p.content import PeerId


@dataclass(frozen=True, slots=True, init=False)
class PeerHint:
    """A swarm member the tracker told us about."""

    peer: PeerId
    rack: str

    def __init__(self, peer: PeerId, rack: str) -> None:
        object.__setattr__(self, "peer", peer)
        object.__setattr__(self, "rack", rack)


# ---- events -----------------------------------------------------------------


@dataclass(frozen=True, slots=True, init=False)
class PeersFound:
    """The tracker answered an announce.

    `origin_slot` is our index among the swarm's origin fetchers (None if we are
    not one); `origin_slots` is how many there are. Fetcher `i` owns the chunks
    `c` with `c % origin_slots == i` that no peer holds or is fetching; while
    only `origin_filled` slots have a fetcher, vacant slot `v` is fetcher
    `v % origin_filled`'s too.
    """

    peers: tuple[PeerHint, ...]
    origin_slot: int | None = None
    origin_slots: int = 1
    origin_filled: int | None = None  # None: every slot has a fetcher

    def __init__(self, peers: tuple[PeerHint, ...], origin_slot: int | None = None,
                 origin_slots: int = 1, origin_filled: int | None = None) -> None:
        object.__setattr__(self, "peers", peers)
        object.__setattr__(self, "origin_slot", origin_slot)
        object.__setattr__(self, "origin_slots", origin_slots)
        object.__setattr__(self, "origin_filled", origin_filled)


@dataclass(frozen=True, slots=True, init=False)
class PeerJoined:
    """A connection to `peer` is up and it told us what it holds for this content."""

    peer: PeerId
    rack: str
    have: tuple[bool, ...]
    pending: tuple[int, ...] = ()
    # The address the connection comes from: what a ban for bad bytes is keyed by, since
    # a peer id is only a claim ("" where there is none, as in simulations: the id then).
    host: str = ""

    def __init__(self, peer: PeerId, rack: str, have: tuple[bool, ...],
                 pending: tuple[int, ...] = (), host: str = "") -> None:
        object.__setattr__(self, "peer", peer)
        object.__setattr__(self, "rack", rack)
        object.__setattr__(self, "have", have)
        object.__setattr__(self, "pending", pending)
        object.__setattr__(self, "host", host)


@dataclass(frozen=True, slots=True, init=False)
class PeerHas:
    peer: PeerId
    chunk: int

    def __init__(self, peer: PeerId, chunk: int) -> None:
        object.__setattr__(self, "peer", peer)
        object.__setattr__(self, "chunk", chunk)


@dataclass(frozen=True, slots=True, init=False)
class PeerPending:
    """`peer` started fetching `chunk` from the origin."""

    peer: PeerId
    chunk: int

    def __init__(self, peer: PeerId, chunk: int) -> None:
        object.__setattr__(self, "peer", peer)
        object.__setattr__(self, "chunk", chunk)


@dataclass(frozen=True, slots=True, init=False)
class PeerWithdrew:
    """`peer` stopped fetching `chunk` from the origin (the fetch failed there)."""

    peer: PeerId
    chunk: int

    def __init__(self, peer: PeerId, chunk: int) -> None:
        object.__setattr__(self, "peer", peer)
        object.__setattr__(self, "chunk", chunk)


@dataclass(frozen=True, slots=True, init=False)
class PeerLost:
    """The connection to `peer` closed, or could not be opened.

    `hostile`: it failed authentication or broke the protocol.
    """

    peer: PeerId
    reason: str
    hostile: bool = False

    def __init__(self, peer: PeerId, reason: str, hostile: bool = False) -> None:
        object.__setattr__(self, "peer", peer)
        object.__setattr__(self, "reason", reason)
        object.__setattr__(self, "hostile", hostile)


@dataclass(frozen=True, slots=True, init=False)
class ChunkArrived:
    """A chunk's bytes arrived; `ok` tells whether they matched the manifest."""

    chunk: int
    source: PeerId | None
    ok: bool

    def __init__(self, chunk: int, source: PeerId | None, ok: bool) -> None:
        object.__setattr__(self, "chunk", chunk)
        object.__setattr__(self, "source", source)
        object.__setattr__(self, "ok", ok)


@dataclass(frozen=True, slots=True, init=False)
class ChunkFailed:
    """A request ended without bytes: rejected, connection error, origin error."""

    chunk: int
    source: PeerId | None
    reason: str
    # The origin's answer will not change if asked again soon (404, refused, wrong length):
    # a content that only ever gets such answers fails within `origin_refused_s`.
    definite: bool = False

    def __init__(self, chunk: int, source: PeerId | None, reason: str,
                 definite: bool = False) -> None:
        object.__setattr__(self, "chunk", chunk)
        object.__setattr__(self, "source", source)
        object.__setattr__(self, "reason", reason)
        object.__setattr__(self, "definite", definite)


@dataclass(frozen=True, slots=True, init=False)
class ChunkLost:
    """A held chunk failed its check on disk (or vanished) and was deleted: want it again."""

    chunk: int

    def __init__(self, chunk: int) -> None:
        object.__setattr__(self, "chunk", chunk)


@dataclass(frozen=True, slots=True, init=False)
class ReaderWants:
    """A local reader is blocked on these chunks: they go before everything else.

    A lazy swarm adds them to the chunks it wants."""

    chunks: tuple[int, ...]

    def __init__(self, chunks: tuple[int, ...]) -> None:
        object.__setattr__(self, "chunks", chunks)


@dataclass(frozen=True, slots=True, init=False)
class PrefetchGiven:
    """An ordered list (e.g. recorded hot blocks) to fetch before rarest-first.

    It replaces the previous order; a lazy swarm adds its chunks to what it wants."""

    chunks: tuple[int, ...]

    def __init__(self, chunks: tuple[int, ...]) -> None:
        object.__setattr__(self, "chunks", chunks)


@dataclass(frozen=True, slots=True, init=False)
class WantedAll:
    """Someone needs the whole content (e.g. `ensure`): a lazy swarm fetches every chunk."""


Event = (
    PeersFound | PeerJoined | PeerHas | PeerPending | PeerWithdrew | PeerLost | ChunkArrived
    | ChunkFailed | ChunkLost | ReaderWants | PrefetchGiven | WantedAll
)


# ---- actions ----------------------------------------------------------------


@dataclass(frozen=True, slots=True, init=False)
class Connect:
    peer: PeerId

    def __init__(self, peer: PeerId) -> None:
        object.__setattr__(self, "peer", peer)


@dataclass(frozen=True, slots=True, init=False)
class Request:
    peer: PeerId
    chunk: int

    def __init__(self, peer: PeerId, chunk: int) -> None:
        object.__setattr__(self, "peer", peer)
        object.__setattr__(self, "chunk", chunk)


@dataclass(frozen=True, slots=True, init=False)
class FetchFromOrigin:
    chunk: int

    def __init__(self, chunk: int) -> None:
        object.__setattr__(self, "chunk", chunk)


@dataclass(frozen=True, slots=True, init=False)
class Cancel:
    """Drop the request for `chunk` at `peer`: another copy arrived. `if_unsent`: it
    timed out, and is dropped only if it still waits for our download budget; one
    already sent is left to finish, and its piece is taken if the chunk is still
    missing when it comes."""

    peer: PeerId
    chunk: int
    if_unsent: bool = False

    def __init__(self, peer: PeerId, chunk: int, if_unsent: bool = False) -> None:
        object.__setattr__(self, "peer", peer)
        object.__setattr__(self, "chunk", chunk)
        object.__setattr__(self, "if_unsent", if_unsent)


@dataclass(frozen=True, slots=True, init=False)
class Disconnect:
    """Stop using `peer` for this content; if `hostile`, cut it off altogether."""

    peer: PeerId
    reason: str
    hostile: bool = False  # it sent bad data or broke the protocol

    def __init__(self, peer: PeerId, reason: str, hostile: bool = False) -> None:
        object.__setattr__(self, "peer", peer)
        object.__setattr__(self, "reason", reason)
        object.__setattr__(self, "hostile", hostile)


@dataclass(frozen=True, slots=True, init=False)
class Report:
    """Tell the tracker that `peer` misbehaved."""

    peer: PeerId
    reason: str

    def __init__(self, peer: PeerId, reason: str) -> None:
        object.__setattr__(self, "peer", peer)
        object.__setattr__(self, "reason", reason)


@dataclass(frozen=True, slots=True, init=False)
class Advertise:
    """Tell connected peers we now hold `chunk` (or, if `pending`, are fetching it)."""

    chunk: int
    pending: bool = False

    def __init__(self, chunk: int, pending: bool = False) -> None:
        object.__setattr__(self, "chunk", chunk)
        object.__setattr__(self, "pending", pending)


@dataclass(frozen=True, slots=True, init=False)
class Withdraw:
    """Tell connected peers we no longer fetch `chunk` (we had said we did: `Advertise`
    with `pending`)."""

    chunk: int

    def __init__(self, chunk: int) -> None:
        object.__setattr__(self, "chunk", chunk)


@dataclass(frozen=True, slots=True, init=False)
class Complete:
    """Every chunk is held and verified."""


@dataclass(frozen=True, slots=True, init=False)
class Abort:
    """The content cannot be completed (e.g. the origin keeps serving bad bytes)."""

    reason: str

    def __init__(self, reason: str) -> None:
        object.__setattr__(self, "reason", reason)


Action = (
    Connect | Request | FetchFromOrigin | Cancel | Disconnect | Report | Advertise | Withdraw
    | Complete | Abort
)
