"""A token bucket for consumption rate limits (per queue now; per connection and cluster-wide
scopes come with the admin API). Time is passed in, so tests need no sleeping."""

from __future__ import annotations


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
