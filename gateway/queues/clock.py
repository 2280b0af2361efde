"""The clock the gateway's layers read, passed in so tests can hold time still.

Two readings, as the runtime needs them: ``monotonic()`` seconds for intervals, deadlines and
timers (never goes back), and ``wall_ms()`` milliseconds since the epoch for what is compared
with stored timestamps (TTL deadlines, stream offsets by time). Nothing below the node reads
``time`` itself; the node builds one ``SystemClock`` and hands it down, and tests hand down a
fake (tests/harness/clock.py) whose time moves only when told.
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def monotonic(self) -> float:
        """Seconds on a clock that never goes back (intervals, deadlines, timers)."""
        ...

    def wall_ms(self) -> int:
        """Milliseconds since the Unix epoch (compared with stored timestamps)."""
        ...


class SystemClock:
    """The real clock."""

    __slots__ = ()

    # The builtin itself: read once per delivery, so no Python frame around it.
    monotonic = staticmethod(time.monotonic)

    def wall_ms(self) -> int:
        return time.time_ns() // 1_000_000


SYSTEM_CLOCK: Clock = SystemClock()
