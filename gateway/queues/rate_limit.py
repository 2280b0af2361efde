"""Token buckets for consumption rate limits (gateway/controls.py sets them per scope).
Time is passed in, so tests need no sleeping."""

from __future__ import annotations

from collections.abc import Callable


class TokenBucket:
    def __init__(self, rate_per_s: float, now: float, burst: float | None = None) -> None:
        if rate_per_s <= 0:
            raise ValueError("rate must be positive")
        self.rate_per_s = rate_per_s
        # A tenth of a second of burst: smooth enough to hold the rate within a few percent
        # over seconds, coarse enough not to need a wake-up per message.
        self.burst = burst if burst is not None else max(1.0, rate_per_s / 10)
        self.tokens = self.burst
        self._last = now

    def _refill(self, now: float) -> None:
        if now > self._last:
            self.tokens = min(self.burst, self.tokens + (now - self._last) * self.rate_per_s)
            self._last = now

    def available(self, now: float) -> int:
        """Whole messages that may go now."""
        self._refill(now)
        return int(self.tokens)

    def take(self, count: int, now: float) -> None:
        self._refill(now)
        self.tokens -= count

    def next_token_at(self, now: float) -> float:
        """When the next whole token will be there."""
        self._refill(now)
        missing = 1.0 - self.tokens
        return now if missing <= 0 else now + missing / self.rate_per_s


class Limits:
    """The rate limits that apply to one connection's deliveries: every bucket must hold a
    whole token. Message buckets pay one token a delivery, byte buckets the body size (a byte
    bucket may go into debt, so a message larger than its burst still goes, and the average
    holds). Buckets are shared: a node's or a client's limit is one bucket for all its
    connections."""

    __slots__ = ("byte_buckets", "clock", "msg_buckets")

    def __init__(
        self,
        msg_buckets: tuple[TokenBucket, ...],
        byte_buckets: tuple[TokenBucket, ...],
        clock: Callable[[], float],
    ) -> None:
        self.msg_buckets = msg_buckets
        self.byte_buckets = byte_buckets
        self.clock = clock

    def ready(self) -> bool:
        now = self.clock()
        return all(b.available(now) >= 1 for b in self.msg_buckets) and all(
            b.available(now) >= 1 for b in self.byte_buckets
        )

    def take(self, body_bytes: int) -> None:
        now = self.clock()
        for bucket in self.msg_buckets:
            bucket.take(1, now)
        for bucket in self.byte_buckets:
            bucket.take(body_bytes, now)

    def next_at(self) -> float:
        """When every bucket will hold a token again."""
        now = self.clock()
        return max(b.next_token_at(now) for b in self.msg_buckets + self.byte_buckets)
