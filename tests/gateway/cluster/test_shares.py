"""How a cluster-wide rate is divided among gateways (gateway/cluster/shares.py ``divide``)
and how a bucket takes a changing share (gateway/queues/rate_limit.py)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.cluster.shares import HEADROOM, Use, divide
from gateway.queues.rate_limit import NO_SHARE_RETRY_S, TokenBucket


def test_busy_gateways_split_the_rate_evenly_whatever_their_consumers() -> None:
    shares = divide(1000, {"a": Use(900, short=True), "b": Use(100, short=True)})
    assert shares == {"a": 500, "b": 500}


def test_a_gateway_not_short_keeps_what_it_uses_and_the_rest_goes_to_the_short() -> None:
    shares = divide(1000, {"a": Use(100, short=False), "b": Use(700, short=True)})
    assert shares["a"] == pytest.approx(100 * HEADROOM)
    assert shares["b"] == pytest.approx(1000 - 100 * HEADROOM)


def test_a_gateway_with_nothing_in_scope_holds_no_share() -> None:
    shares = divide(1000, {"a": Use(0, short=False), "b": Use(990, short=True)})
    assert shares == {"a": 0, "b": 1000}


def test_with_nobody_short_what_is_left_goes_to_those_in_use() -> None:
    shares = divide(1000, {"a": Use(100, short=False), "b": Use(0, short=False)})
    assert shares == {"a": 1000, "b": 0}


def test_a_gateway_gone_from_the_reports_counts_for_nothing() -> None:
    assert divide(2000, {"a": Use(1000, short=True)}) == {"a": 2000}


def test_caps_over_the_total_are_scaled_down_to_it() -> None:
    shares = divide(100, {"a": Use(100, short=False), "b": Use(60, short=False)})
    assert sum(shares.values()) == pytest.approx(100)
    assert shares["a"] > shares["b"]


uses = st.dictionaries(
    st.sampled_from(["a", "b", "c", "d"]),
    st.builds(Use, st.floats(0, 50_000), st.booleans()),
    min_size=1,
)


@given(total=st.floats(1, 100_000), uses=uses)
def test_shares_never_add_up_to_more_than_the_total(total: float, uses: dict[str, Use]) -> None:
    shares = divide(total, uses)
    assert set(shares) == set(uses)
    assert all(share >= 0 for share in shares.values())
    assert sum(shares.values()) <= total * (1 + 1e-9)
    if any(u.short or u.used > 0 for u in uses.values()):
        assert sum(shares.values()) == pytest.approx(total)


def test_a_bucket_without_a_share_gives_nothing_and_says_it_was_short() -> None:
    bucket = TokenBucket(0.0, now=0.0)
    assert bucket.available(10.0) == 0
    assert bucket.short
    assert bucket.next_token_at(10.0) == 10.0 + NO_SHARE_RETRY_S


def test_a_new_share_keeps_what_was_earned_within_the_new_burst() -> None:
    bucket = TokenBucket(1000.0, now=0.0)  # burst 100
    bucket.take(100, 0.0)
    bucket.set_rate(100.0, 0.05)  # 50 earned at 1000/s; the new burst is 10
    assert bucket.available(0.05) == 10
    bucket.take(10, 0.05)
    assert bucket.available(0.15) == 10  # 100/s from here on
    assert bucket.spent == 110


def test_a_share_taken_away_stops_the_bucket_at_once() -> None:
    bucket = TokenBucket(1000.0, now=0.0)
    bucket.set_rate(0.0, 0.0)
    assert bucket.available(5.0) == 0
