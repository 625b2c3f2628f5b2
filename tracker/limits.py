"""The tracker's bounded memories of recent requests: replays, rates, log lines.

Theory of operation. Everything here is a plain object driven by `now`, the
caller's clock in seconds, with no I/O, so it is tested with made-up times.

`ReplayCache` remembers the MACs of signed requests until their stamps go
stale. A signed request is valid while its stamp is within `skew` seconds of
the tracker's wall clock, so a MAC needs remembering only until
`stamp + skew`; after that the stamp check refuses the request anyway. MACs
sit in one-second buckets keyed by their stamp, so expiry drops whole buckets
(O(expired), a heap of bucket keys says which is oldest) and a lookup touches
one bucket. The cache holds at most `max_entries` MACs: when it is full, the
oldest bucket is dropped and its second becomes the *floor*; stamps older than
the floor are then refused as too old. So replay protection stays exact and
memory bounded; under extreme load the acceptance window shrinks instead.

`KeyedRateLimit` is one token bucket (p2p.ratelimit.TokenBucket) per key,
created full on first use. A bucket idle long enough to be full again is
indistinguishable from a new one, so keys idle for `burst / rate` seconds are
forgotten; keys are kept in order of last use, so that is O(forgotten) too.

Refusals are logged through `p2p.ratelimit.LogLimiter`, so a flood of bad
requests cannot flood the log.
"""

from __future__ import annotations

import heapq
import math
from collections import OrderedDict
from collections.abc import Hashable

from p2p.ratelimit import TokenBucket

REPLAY_CACHE_ENTRIES = 1_000_000
MAC_PREFIX_BYTES = 16  # 128 bits: collisions between distinct MACs are negligible


class ReplayCache:
    """MACs of signed requests seen while their stamps are fresh. See the module docstring."""

    def __init__(self, skew_seconds: float, max_entries: int = REPLAY_CACHE_ENTRIES) -> None:
        if skew_seconds <= 0 or max_entries < 1:
            raise ValueError("skew_seconds must be > 0 and max_entries >= 1")
        self.skew = skew_seconds
        self.max_entries = max_entries
        self.floor = -math.inf  # stamps older than this are refused
        self._buckets: dict[int, set[bytes]] = {}
        self._keys: list[int] = []  # heap of bucket keys
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def check(self, mac: bytes, stamp: float, now: float) -> str | None:
        """Record `mac`, signed at `stamp`; the reason to refuse it, or None if it is new."""
        self._expire(now)
        if stamp < self.floor:
            return (f"request stamp {stamp:.3f} is older than the replay cache's horizon "
                    f"{self.floor:.0f} (the tracker is under heavy load; check the clock)")
        key = int(stamp)
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = set()
            heapq.heappush(self._keys, key)
        digest = mac[:MAC_PREFIX_BYTES]
        if digest in bucket:
            return "replayed request: this signature was already used"
        bucket.add(digest)
        self._size += 1
        while self._size > self.max_entries:
            self.floor = self._drop_oldest() + 1
        return None

    def _expire(self, now: float) -> None:
        # A bucket holds stamps in [key, key + 1); all are stale once key + 1 + skew < now.
        while self._keys and self._keys[0] + 1 + self.skew < now:
            self._drop_oldest()

    def _drop_oldest(self) -> int:
        key = heapq.heappop(self._keys)
        self._size -= len(self._buckets.pop(key))
        return key


class KeyedRateLimit:
    """`rate` requests per second per key, in bursts of up to `burst`."""

    def __init__(self, rate_per_second: float, burst: int) -> None:
        if not rate_per_second > 0 or burst < 1:
            raise ValueError("rate must be > 0 and burst >= 1")
        self.rate = rate_per_second
        self.burst = burst
        self._idle_seconds = burst / rate_per_second
        self._buckets: OrderedDict[Hashable, tuple[TokenBucket, float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._buckets)

    def take(self, key: Hashable, now: float) -> float:
        """Take one token for `key`: 0.0 if allowed, else the seconds until one is due."""
        self._forget_idle(now)
        entry = self._buckets.pop(key, None)
        bucket = entry[0] if entry else TokenBucket(self.rate, self.burst)
        self._buckets[key] = (bucket, now)  # to the back: the most recently used
        available = bucket.available(now)
        if available < 1:
            return (1 - available) / self.rate
        bucket.reserve(1, now)
        return 0.0

    def _forget_idle(self, now: float) -> None:
        while self._buckets:
            _, (_, used) = next(iter(self._buckets.items()))
            if now - used < self._idle_seconds:
                return
            self._buckets.popitem(last=False)
