"""A latency histogram with fixed buckets: a leaf module, so the scheduler and the store paths
below the observe layer can record into it without importing what reads it."""

from __future__ import annotations

import bisect

LATENCY_BUCKETS_S = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                     0.25, 0.5, 1.0, 2.5)  # fmt: skip


class Histogram:
    """Fixed buckets, observed with one bisect and one list add (Prometheus-shaped)."""

    __slots__ = ("bounds", "count", "counts", "total")

    def __init__(self, bounds: tuple[float, ...] = LATENCY_BUCKETS_S) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last one: above every bound (+Inf)
        self.count = 0
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.count += 1
        self.total += value

    def cumulative(self) -> list[tuple[str, int]]:
        """(le, count at or below it) as the exposition format lists them."""
        running = 0
        result = []
        for bound, count in zip((*map(str, self.bounds), "+Inf"), self.counts, strict=True):
            running += count
            result.append((bound, running))
        return result
