"""Token-bucket rate limiting, as a pure function of the caller's clock.

Theory of operation: a bucket holds up to `burst_bytes` tokens and refills at
`rate_bytes_per_s`. `reserve(n, now)` takes `n` tokens at once and answers how
long the caller must wait before sending those bytes, and `refund(n, now)` gives
back what a cancelled reservation will not send. The bucket may go into
debt: a reservation larger than what is available (even larger than the
burst) is granted, and the debt becomes the wait. Later callers then queue
behind it, because they see the debt first. That gives first-come,
first-served fairness between the connections that share one bucket and a
long-run rate that never exceeds `rate_bytes_per_s` (over any interval T, at
most `burst_bytes + rate * T` bytes are granted for sending by its end).

Time enters only as the `now` argument, in seconds on any monotonic clock the
caller picks; a clock that steps backwards refills nothing. No I/O, no clock
reads, no asyncio: the agent wraps this in `p2p.peer.RateLimiter` (which
sleeps), the simulator can drive it with virtual time, and tests use a fake
clock.
"""

from __future__ import annotations

from collections import Counter

# The agent's rate limiters' burst, which the simulator models too: a chunk's
# worth, so that idle moments are not lost to the cap.
BURST_BYTES = 4 << 20


class TokenBucket:
    """Bytes allowed per second, with bursts of up to `burst_bytes`.

    `rate_bytes_per_s=None` means unlimited: every reservation is free. The
    bucket starts full.
    """

    def __init__(self, rate_bytes_per_s: float | None, burst_bytes: int) -> None:
        if rate_bytes_per_s is not None and not rate_bytes_per_s > 0:
            raise ValueError(f"rate must be positive or None (unlimited), got {rate_bytes_per_s}")
        if burst_bytes < 0:
            raise ValueError(f"burst must be >= 0 bytes, got {burst_bytes}")
        self._rate = rate_bytes_per_s
        self._burst = burst_bytes
        self._tokens = float(burst_bytes)
        self._stamp: float | None = None

    @property
    def rate_bytes_per_s(self) -> float | None:
        return self._rate

    @property
    def burst_bytes(self) -> int:
        return self._burst

    @property
    def unlimited(self) -> bool:
        return self._rate is None

    def reserve(self, n: int, now: float) -> float:
        """Take `n` tokens at time `now`; return the seconds to wait before sending.

        0.0 means "send now". The tokens are taken whatever the answer, so a
        caller that gets a wait must honour it (and must not ask again for
        the same bytes).
        """
        if n < 0:
            raise ValueError(f"cannot reserve a negative number of bytes ({n})")
        if self._rate is None:
            return 0.0
        self._refill(now)
        self._tokens -= n
        return 0.0 if self._tokens >= 0 else -self._tokens / self._rate

    def refund(self, n: int, now: float) -> None:
        """Give back `n` tokens of a reservation whose bytes will never be sent (a
        request cancelled while it waited); the bucket never holds more than its burst.
        Callers already waiting keep their waits: the tokens go to the next reservation."""
        if n < 0:
            raise ValueError(f"cannot refund a negative number of bytes ({n})")
        if self._rate is None:
            return
        self._refill(now)
        self._tokens = min(float(self._burst), self._tokens + n)

    def available(self, now: float) -> float:
        """Tokens that could be taken at `now` without waiting (negative while in debt)."""
        if self._rate is None:
            return float("inf")
        self._refill(now)
        return self._tokens

    def _refill(self, now: float) -> None:
        assert self._rate is not None
        if self._stamp is None:
            self._stamp = now
        elif now > self._stamp:
            self._tokens = min(float(self._burst), self._tokens + (now - self._stamp) * self._rate)
            self._stamp = now


class LogLimiter:
    """At most one log line per key per `every_s`; counts what it held back."""

    def __init__(self, every_s: float = 10.0) -> None:
        self.every_s = every_s
        self._next: dict[str, float] = {}
        self._held: Counter[str] = Counter()

    def allow(self, key: str, now: float) -> int | None:
        """None: stay quiet. Otherwise log now, mentioning the returned count held back."""
        if now < self._next.get(key, float("-inf")):
            self._held[key] += 1
            return None
        self._next[key] = now + self.every_s
        return self._held.pop(key, 0)
