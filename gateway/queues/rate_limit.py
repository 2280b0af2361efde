"""Token buckets for consumption and publish rate limits (gateway/controls.py sets them per
scope). Time is passed in, so tests need no sleeping.

In a cluster a bucket holds this gateway's share of a limit that totals over every gateway
(gateway/cluster/shares.py re-divides it by demand): its rate changes while it is in use,
may be 0 (no share now), and it counts what it let through (``spent``) and whether anything
was held back for want of a token (``short``) for that re-division."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

# A bucket with no share looks again this often (its share may come at any re-division).
NO_SHARE_RETRY_S = 0.05
# A held queue or publisher is woken when this much time's tokens are there, not at the
# first one: at 20,000 msgs/s a wake-up per token was a scheduler turn per message, spent
# on the core the deliveries need. Nothing is lost by waiting: tokens gather up to the
# burst (a tenth of a second's).
WAKE_BATCH_S = 0.005


class TokenBucket:
    __slots__ = ("_fixed_burst", "_last", "burst", "rate_per_s", "short", "spent", "tokens")

    def __init__(self, rate_per_s: float, now: float, burst: float | None = None) -> None:
        if rate_per_s < 0:
            raise ValueError("rate must not be negative")
        self.rate_per_s = rate_per_s
        self._fixed_burst = burst
        # A tenth of a second of burst: smooth enough to hold the rate within a few percent
        # over seconds, coarse enough not to need a wake-up per message.
        self.burst = burst if burst is not None else max(1.0, rate_per_s / 10)
        self.tokens = self.burst if rate_per_s > 0 else 0.0
        self._last = now
        self.spent = 0.0  # tokens taken since the bucket was made
        self.short = False  # found without a whole token (set here, cleared by the reader)

    def set_rate(self, rate_per_s: float, now: float) -> None:
        """A new share: what was earned so far at the old rate stays, within the new burst."""
        self._refill(now)
        self.rate_per_s = max(0.0, rate_per_s)
        if self._fixed_burst is None:
            self.burst = max(1.0, self.rate_per_s / 10) if self.rate_per_s > 0 else 0.0
        self.tokens = min(self.tokens, self.burst)

    def _refill(self, now: float) -> None:
        if now > self._last:
            self.tokens = min(self.burst, self.tokens + (now - self._last) * self.rate_per_s)
            self._last = now

    def available(self, now: float) -> int:
        """Whole messages that may go now."""
        self._refill(now)
        if self.tokens < 1:
            self.short = True
        return int(self.tokens)

    def take(self, count: int, now: float) -> None:
        self._refill(now)
        self.tokens -= count
        self.spent += count

    def next_token_at(self, now: float) -> float:
        """When the next whole token will be there, or WAKE_BATCH_S's worth at high rates."""
        self._refill(now)
        wanted = min(self.burst, max(1.0, self.rate_per_s * WAKE_BATCH_S))
        missing = wanted - self.tokens
        if missing <= 0:
            return now
        if self.rate_per_s <= 0:
            return now + NO_SHARE_RETRY_S
        return now + missing / self.rate_per_s


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

    def take_publishes(self, count: int, body_bytes: int) -> None:
        """A batch of publishes read from one connection (publish limits)."""
        now = self.clock()
        for bucket in self.msg_buckets:
            bucket.take(count, now)
        for bucket in self.byte_buckets:
            bucket.take(body_bytes, now)


@dataclass(slots=True)
class ControlBuckets:
    """The buckets of one control (gateway/controls.py): deliveries and publishes, each in
    messages and bytes; None where the control sets no such rate."""

    msgs: TokenBucket | None = None
    bytes: TokenBucket | None = None
    publish_msgs: TokenBucket | None = None
    publish_bytes: TokenBucket | None = None

    def by_field(self) -> dict[str, TokenBucket | None]:
        """The buckets by the control's rate field (``RATE_FIELDS``)."""
        buckets = (self.msgs, self.bytes, self.publish_msgs, self.publish_bytes)
        return dict(zip(RATE_FIELDS, buckets, strict=True))


# The control's field of each kind of bucket, in ControlBuckets' order.
RATE_FIELDS = ("rate_msgs", "rate_bytes", "publish_rate_msgs", "publish_rate_bytes")
