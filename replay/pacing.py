"""When each message is due: an absolute schedule, never a sleep per gap.

A message captured at ``t`` (ms) is due at ``start + (t - t0) / speed`` (seconds, wall
clock): a sender that falls behind catches up instead of accumulating every gap's sleep
error. ``--rate N`` spaces sends at least ``1/N`` s apart on the same absolute clock (each
due time is the later of the capture schedule and the previous due time plus the interval).
Within one order key the schedule never goes backwards, even when the capture's clock did,
so pacing cannot reorder a key. The sender (replay.confirm_window) publishes a message no
earlier than its due time; its window only bounds how many wait for a confirm.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

UNBOUNDED = math.inf  # --speed max: as fast as the target confirms


def parse_speed(text: str) -> float:
    """``--speed``: a positive factor, or ``max`` for no pacing at all."""
    if text.lower() in ("max", "inf", "unbounded"):
        return UNBOUNDED
    value = float(text)
    if not value > 0:
        raise ValueError(f"speed must be positive or 'max', not {text!r}")
    return value


@dataclass
class Schedule:
    """The due times of one sender's messages, in the order it sends them."""

    start_s: float  # wall-clock epoch seconds of capture time t0
    t0_ms: int
    speed: float = 1.0
    rate: float | None = None  # msgs/s for this sender; None: no cap
    _last_due: float = -math.inf

    def due(self, ts_ms: int) -> float:
        """The due time (epoch s) of the next message, captured at ``ts_ms``."""
        if self.speed == UNBOUNDED:
            at = self.start_s
        else:
            at = self.start_s + (ts_ms - self.t0_ms) / 1000.0 / self.speed
        if self.rate is not None and self._last_due > -math.inf:
            at = max(at, self._last_due + 1.0 / self.rate)
        at = max(at, self._last_due)
        self._last_due = at
        return at


def monotone_times(times_ms: list[int]) -> list[int]:
    """A key's capture times made non-decreasing (running maximum): the order-safe schedule."""
    out: list[int] = []
    high = -(2**63)
    for t in times_ms:
        high = max(high, t)
        out.append(high)
    return out


def share_of_rate(rate: float | None, senders: int) -> float | None:
    """Each of ``senders`` concurrent senders' part of a total ``--rate`` cap."""
    if rate is None:
        return None
    if rate <= 0:
        raise ValueError("rate must be positive")
    return rate / max(1, senders)
