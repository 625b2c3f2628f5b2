"""The agent's Prometheus metrics, on a registry of its own (one per agent)."""

from __future__ import annotations

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    disable_created_metrics,
    generate_latest,
)

# Every counter would also export a `_created` series (its creation time): twice the
# series for nothing a dashboard uses. The switch is process-wide; the tracker's
# metrics (tracker.state) turn it off too.
disable_created_metrics()  # type: ignore[no-untyped-call]


class AgentMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.origin_bytes = Counter("bootseer_origin_bytes", "Bytes of verified chunks "
                                    "fetched from origins", registry=r)
        self.peer_bytes = Counter("bootseer_peer_bytes", "Bytes of verified chunks fetched "
                                  "from peers", registry=r)
        self.served_bytes = Counter("bootseer_served_bytes", "Bytes served to peers", registry=r)
        self.wasted_bytes = Counter("bootseer_wasted_bytes", "Piece bytes received after the "
                                    "request was withdrawn (end-game duplicates), and the "
                                    "parts of relays that ended early", registry=r)
        self.request_timeouts = Counter("bootseer_request_timeouts", "Requests to peers not "
                                        "answered within swarm.request_timeout_s: asked "
                                        "elsewhere, and what comes late is wasted", registry=r)
        self.requests_cancelled = Counter("bootseer_requests_cancelled", "Peers' requests "
                                          "skipped because they cancelled them", registry=r)
        self.withdrawals_heard = Counter("bootseer_withdrawals_heard", "Peers' origin fetches "
                                         "they said had failed (pending marks taken back)",
                                         registry=r)
        self.relays = Counter("bootseer_relays", "Chunks peers asked for while we fetched them "
                              "from the origin, by how the relay ended: sent whole, ended "
                              "(the origin read failed), cancelled (by the peer)", ["result"],
                              registry=r)
        self.chunks_verified = Counter("bootseer_chunks_verified",
                                       "Chunks that matched the manifest", registry=r)
        self.chunks_rejected = Counter("bootseer_chunks_rejected",
                                       "Chunks that failed verification", ["source"], registry=r)
        self.chunks_damaged = Counter("bootseer_chunks_damaged",
                                      "Stored chunk files that failed their check on the way "
                                      "out (deleted and fetched again)", registry=r)
        self.peers_connected = Gauge("bootseer_peers_connected", "Open peer connections",
                                     registry=r)
        self.peers_dropped = Counter("bootseer_peers_dropped",
                                     "Peer connections closed for misbehaviour", registry=r)
        self.connections_refused = Counter(
            "bootseer_connections_refused", "Inbound peer connections closed at accept",
            ["reason"], registry=r)
        self.accept_errors = Counter("bootseer_accept_errors",
                                     "Accepts that failed for lack of descriptors or memory",
                                     registry=r)
        self.addresses_banned = Counter("bootseer_addresses_banned",
                                        "Peer addresses banned for misbehaviour", registry=r)
        self.contents = Gauge("bootseer_contents", "Contents being fetched or served",
                              registry=r)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
