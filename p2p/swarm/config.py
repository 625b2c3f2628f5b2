"""The knobs of one swarm, with their defaults and why they are what they are."""

from __future__ import annotations

from dataclasses import dataclass

from p2p.swarm.policy import CHUNK_PICKERS, PEER_CHOOSERS


@dataclass(frozen=True, slots=True)
class SwarmConfig:
    """Knobs of one swarm; every duration is in seconds."""

    max_peers: int = 30  # connections we open ourselves
    # Of those, at least this share go to other racks while any are known: with
    # same-rack peers only, each rack is a cluster that chunks leave through a few
    # inbound links (Kraken's run, 2,600 hosts, 5 peers each: see RESULTS.md).
    cross_rack_share: float = 0.0
    # One request per peer at a time: the next is placed when a piece lands,
    # with fresh knowledge, so busy peers get less. Deeper pipelines queue
    # requests at whichever peer was picked first; measured with 50 MB/s caps on
    # 8 nodes, a depth of 4 ran at 1.9x the lower bound, a depth of 1 at 1.35x.
    per_peer_inflight: int = 1
    max_inflight: int = 16  # requests to peers, all together
    max_origin_inflight: int = 2  # concurrent origin fetches by this node
    request_timeout_s: float = 15.0  # a peer request unanswered this long goes elsewhere
    origin_timeout_s: float = 60.0  # an origin read of one chunk that takes longer fails
    origin_patience_s: float = 3.0  # starved this long, tracker silent -> go to the origin
    appointed_patience_s: float = 20.0  # the same, when the tracker appointed others
    settle_s: float = 0.5  # wait this long to hear peers' pending lists before fetching
    # Fetcher 0 leaves the vacant fetcher slots' chunks alone this long after it first
    # covers and wants them (a peer joining meanwhile puts it off, up to twice this):
    # nodes that start together are appointed a moment apart, and it hears of the
    # others (their pending marks, its early announce) within about this long.
    # A node alone pays it once per content (p2p.swarm.origin has the measurements).
    vacant_grace_s: float = 0.25
    pending_ttl_s: float = 30.0  # how long a peer's "fetching from origin" counts
    backoff_base_s: float = 0.5  # a failing peer is left alone this long, doubling
    backoff_max_s: float = 30.0  # ... up to this long
    max_peer_failures: int = 4  # consecutive; then disconnect
    endgame_duplicates: int = 1  # extra copies of a tail request
    endgame_tail: int = 2  # duplicate only when this few chunks are missing
    max_origin_corrupt: int = 3  # bad chunks from the origin before aborting
    # No chunk arrived for this long while chunks are wanted: abort, saying what was
    # tried. Generous: a slow origin or a swarm at a cold start is not a dead one.
    no_source_deadline_s: float = 180.0
    # The origin answered only "no" (404, refused, wrong length) for this long, and no
    # connected peer holds or is fetching a missing chunk: abort now, with the origin's
    # answer, instead of after the deadline above. A few backed-off retries fit in it.
    origin_refused_s: float = 5.0
    # Request leftover slots' worth of chunks that peers are fetching from the origin:
    # such a peer relays the bytes as they come, so the last chunks out of the origin
    # spread while they arrive instead of after (p2p.relay).
    relay_pending: bool = True
    # Also announce as pending the chunks we are fetching from peers, so that a peer
    # can ask us to relay one while it arrives (cut-through): a chunk then crosses
    # several hops in little more than one chunk-time (p2p.relay). Real agents, stop
    # 30: the capped bench (8 x 256 MiB, 50 MB/s, alternating rounds) 1.077-1.097 x its
    # bound with it against 1.127-1.139 without; 64 MiB at 8 MB/s caps, 16 agents
    # 12.9-14.0 s against 16.4-17.3, 32 agents 17.1-18.8 against 21.7-22.8. Where 32
    # agents share this machine's 2 cores at 20 MB/s each they are CPU-bound, and slower
    # with it (stop 29: 12.9-15.1 s against 10.8-12.6; simulations/CALIBRATION.md), as
    # is the uncapped bench on loopback (474-530 MB/s against 547-643): relays cost CPU.
    relay_fetching: bool = True
    # ... if at most this many of our peers hold it (the one we ask, usually): where
    # more do, our peers' peers likely do too. Simulated at 1,000 nodes, 1 kept the
    # whole gain of announcing every chunk (scale p99 3.21 s, launch 4.41 s, against
    # 3.43 and 5.86 without) with 26-29% fewer swarm events; 0 lost launch's.
    relay_fetching_holders: int = 1
    use_peers: bool = True  # False: the origin-only baseline
    chunk_picker: str = "rarest_first"  # rarest_first, in_order or random (p2p.swarm.policy)
    peer_chooser: str = "rack_aware"  # rack_aware, least_loaded or random

    def __post_init__(self) -> None:
        if self.chunk_picker not in CHUNK_PICKERS:
            raise ValueError(f"unknown chunk picker {self.chunk_picker!r}; "
                             f"choose from {sorted(CHUNK_PICKERS)}")
        if self.peer_chooser not in PEER_CHOOSERS:
            raise ValueError(f"unknown peer chooser {self.peer_chooser!r}; "
                             f"choose from {sorted(PEER_CHOOSERS)}")
        if min(self.max_peers, self.per_peer_inflight, self.max_inflight,
               self.max_origin_inflight) < 1:
            raise ValueError("peer and in-flight limits must be at least 1")
        if not 0.0 <= self.cross_rack_share <= 1.0:
            raise ValueError("cross_rack_share must be between 0 and 1")
        if self.no_source_deadline_s <= 0 or self.origin_refused_s <= 0:
            raise ValueError("no_source_deadline_s and origin_refused_s must be positive")
