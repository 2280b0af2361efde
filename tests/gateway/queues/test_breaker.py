"""The depth breaker's rules (gateway/queues/breaker.py, meta/breaker_policy.py), on a fake
clock: hysteresis, bounds from x-max-length or N, kept state across a behaviour change."""

from __future__ import annotations

from types import SimpleNamespace

import anyio
import pytest

from gateway.queues.breaker import BreakerWatch, DepthBreaker, breaker_for
from meta.breaker_policy import BreakerInvalid, BreakerSpec, breaker_of, parse_breaker


def test_it_trips_above_high_and_resets_below_low_only() -> None:
    breaker = DepthBreaker(BreakerSpec(), high=70, low=50)
    assert breaker.judge(70, now=1.0) is None  # at high: not past it
    assert breaker.judge(71, now=2.0) == "tripped"
    assert breaker.judge(90, now=3.0) is None
    assert breaker.judge(50, now=4.0) is None  # at low: still tripped
    assert breaker.tripped and breaker.time_tripped(5.0) == 3.0
    assert breaker.judge(49, now=6.0) == "reset"
    assert breaker.judge(60, now=7.0) is None  # between: stays closed
    assert (breaker.trips, breaker.tripped_s) == (1, 4.0)


def test_bounds_come_from_max_length_or_a_count() -> None:
    assert BreakerSpec(0.7, 0.5).bounds(1000) == (700, 500)
    assert BreakerSpec(0.7, 0.5).bounds(None) is None  # of max-length, and it has none
    assert BreakerSpec(0.75, 0.25, of=10).bounds(None) == (7, 3)
    assert parse_breaker({}) == BreakerSpec(0.7, 0.5, None, "reject")
    assert parse_breaker({"high": 0.3}).low == 0.3  # low defaults to at most high
    assert parse_breaker({"of": 5000, "action": "block"}) == BreakerSpec(0.7, 0.5, 5000, "block")
    assert breaker_of({"breaker": {"high": 7}}) is None  # stored before it was checked
    with pytest.raises(BreakerInvalid, match="'of' must be"):
        parse_breaker({"of": True})


def test_a_policy_change_keeps_the_state_unless_the_breaker_changed() -> None:
    spec = BreakerSpec(0.7, 0.5, of=100)
    first = breaker_for(spec, None, None, now=0.0)
    assert first is not None
    first.judge(80, now=1.0)
    assert breaker_for(spec, None, first, now=2.0) is first  # the same: state kept
    signal = first.reset_signal()
    other = breaker_for(BreakerSpec(0.8, 0.5, of=100), None, first, now=3.0)
    assert other is not None and other is not first and not other.tripped
    assert signal.is_set()  # held publishers of the old one go on
    assert breaker_for(None, None, other, now=4.0) is None


class _Queue:
    def __init__(self, breaker: DepthBreaker) -> None:
        self.breaker: DepthBreaker | None = breaker
        self.deleted = False
        self.name = "q"
        self.definition = SimpleNamespace(vhost="/")


def test_the_watch_resets_a_tripped_breaker_and_releases_held_publishers() -> None:
    breaker = DepthBreaker(BreakerSpec(action="block"), high=10, low=5)
    queue = _Queue(breaker)
    depth = {"now": 20}
    clock = {"now": 0.0}

    async def depth_of(_queue: object) -> int:
        return depth["now"]

    watch = BreakerWatch(lambda: [queue], depth_of, lambda: clock["now"])  # type: ignore[list-item]

    async def main() -> None:
        await watch.judge(queue)  # type: ignore[arg-type]
        assert breaker.tripped
        signal = breaker.reset_signal()
        depth["now"], clock["now"] = 4, 2.5
        await watch.pass_once()
        assert not breaker.tripped and signal.is_set()
        assert breaker.time_tripped(9.0) == 2.5

    anyio.run(main)
