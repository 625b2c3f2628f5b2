"""Who may hold a connection to this agent: caps and address bans (no I/O).

Theory of operation. Every inbound connection is admitted or refused right
after accept, before any buffer is allocated for it, by `ConnectionGuard.admit`:

- an address banned for misbehaviour is refused until its ban expires;
- at most `max_handshakes` connections may be authenticating at once, and
  at most `max_handshakes_per_ip` from one address (other than our own), so
  one flooding host cannot take every handshake slot from honest peers;
- at most `max_connections` connections in all (handshakes plus links).

A node's identity is its address (see p2p.handshake), so a ban names an
address, not a peer id: a peer that comes back under a new id is still
banned. Our own address is never banned: in a test every honest process
shares 127.0.0.1, and in production it is us.

`p2p.ratelimit.LogLimiter` keeps the refusals from flooding the log: one
line per reason per `every_s`, saying how many were left out.

Time enters as `now` (seconds on the caller's clock); nothing here reads a
clock or touches a socket.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    max_connections: int = 1024  # handshakes in flight plus authenticated links
    max_handshakes: int = 64
    max_handshakes_per_ip: int = 8
    ban_s: float = 600.0  # how long a misbehaving address is refused

    def __post_init__(self) -> None:
        if min(self.max_connections, self.max_handshakes, self.max_handshakes_per_ip) < 1:
            raise ValueError("connection limits must be at least 1")


class ConnectionGuard:
    """Admission of peer connections; see the module docstring."""

    def __init__(self, limits: ConnectionLimits, own_ips: frozenset[str]) -> None:
        self.limits = limits
        self._own = own_ips
        self._handshakes: Counter[str] = Counter()  # ip -> handshakes in flight
        self._links = 0
        self._bans: dict[str, float] = {}  # ip -> banned until

    @property
    def handshakes(self) -> int:
        return self._handshakes.total()

    @property
    def connections(self) -> int:
        return self.handshakes + self._links

    def admit(self, ip: str, now: float) -> str | None:
        """Why a new connection from `ip` is refused, or None: then its handshake is counted
        and `handshake_ended` must follow."""
        limits = self.limits
        if self.banned(ip, now):
            return "banned"
        if self.connections >= limits.max_connections:
            return "connections"
        if self.handshakes >= limits.max_handshakes:
            return "handshakes"
        if self._handshakes[ip] >= limits.max_handshakes_per_ip and ip not in self._own:
            return "handshakes_per_ip"
        self._handshakes[ip] += 1
        return None

    def handshake_ended(self, ip: str) -> None:
        self._handshakes[ip] -= 1
        if self._handshakes[ip] <= 0:
            del self._handshakes[ip]

    def link_opened(self) -> None:
        self._links += 1

    def link_closed(self) -> None:
        self._links = max(0, self._links - 1)

    def ban(self, ip: str, now: float) -> bool:
        """Refuse `ip` for `ban_s`; False if it is our own address (never banned) or is
        banned already (the ban is not extended)."""
        if ip in self._own or self.banned(ip, now):
            return False
        for old in [i for i, until in self._bans.items() if until <= now]:
            del self._bans[old]
        self._bans[ip] = now + self.limits.ban_s
        return True

    def banned(self, ip: str, now: float) -> bool:
        return self._bans.get(ip, 0.0) > now
