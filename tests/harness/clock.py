"""One fake clock for every test: time moves only when the test moves it.

It is the gateway's ``Clock`` (gateway/queues/clock.py: ``monotonic()`` seconds and
``wall_ms()``), and called bare it answers milliseconds, as the store's and the log timer's
clocks are called. The two readings move together, so a deadline in either is crossed at
the same step.
"""

from __future__ import annotations

T0_MS = 1_700_000_000_000


class FakeClock:
    def __init__(self, now_ms: int = T0_MS) -> None:
        self.now_ms = now_ms

    def __call__(self) -> int:
        return self.now_ms

    def wall_ms(self) -> int:
        return self.now_ms

    def monotonic(self) -> float:
        return self.now_ms / 1000

    def advance(self, seconds: float) -> None:
        self.now_ms += round(seconds * 1000)
