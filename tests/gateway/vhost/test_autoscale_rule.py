"""The autoscale rule (gateway/vhost/autoscale.py ``decide``) on a fake clock, and the policy's
checks (meta/autoscale_policy.py)."""

from __future__ import annotations

import pytest

from gateway.vhost.autoscale import ScaleState, decide
from meta.autoscale_policy import AutoscaleInvalid, AutoscaleSpec, parse_autoscale

SPEC = AutoscaleSpec(low=1, high=3, depth=100, lag_s=None, window_s=10)


def test_it_grows_only_after_a_whole_window_above_and_never_past_max() -> None:
    state = ScaleState()
    assert decide(SPEC, state, 1, 500, None, True, now=0.0) is None
    assert decide(SPEC, state, 1, 50, None, True, now=5.0) is None  # dipped: window restarts
    assert decide(SPEC, state, 1, 500, None, True, now=6.0) is None
    assert decide(SPEC, state, 1, 500, None, True, now=15.9) is None
    assert decide(SPEC, state, 1, 500, None, True, now=16.0) == (2, "depth 500 above 100 for 10 s")
    assert decide(SPEC, state, 3, 500, None, True, now=40.0) is None  # at max


def test_it_shrinks_when_idle_for_a_window_and_never_below_min() -> None:
    state = ScaleState()
    assert decide(SPEC, state, 3, 0, None, False, now=0.0) is None
    assert decide(SPEC, state, 3, 0, None, True, now=5.0) is None  # a publish: not idle
    assert decide(SPEC, state, 3, 0, None, False, now=6.0) is None
    assert decide(SPEC, state, 3, 0, None, False, now=16.0) == (2, "idle for 10 s")
    assert decide(SPEC, state, 1, 0, None, False, now=99.0) is None  # at min


def test_lag_grows_it_and_bounds_pull_it_back() -> None:
    lagging = AutoscaleSpec(low=2, high=4, depth=None, lag_s=30, window_s=1)
    state = ScaleState()
    assert decide(lagging, state, 1, 0, None, False, now=0.0) == (2, "below min 2")
    assert decide(lagging, state, 5, 0, None, False, now=0.0) == (4, "above max 4")
    assert decide(lagging, state, 2, 10, 45.0, True, now=1.0) is None
    assert decide(lagging, state, 2, 10, 45.0, True, now=2.0) == (
        3,
        "lag 45.0 s above 30 s for 1 s",
    )


def test_the_policy_is_checked() -> None:
    assert parse_autoscale({}) == AutoscaleSpec()
    assert parse_autoscale({"lag_s": 5}).depth is None
    for bad, reason in [({"min": 0}, "'min' must be an integer from 1"),
                        ({"min": 5, "max": 2}, "'min' (5) must not be above 'max' (2)"),
                        ({"depth": -1}, "'depth' must be a positive number"),
                        ({"steps": 2}, "unknown: steps"), ([], "must be an object")]:  # fmt: skip
        with pytest.raises(AutoscaleInvalid, match=reason.replace("(", r"\(").replace(")", r"\)")):
            parse_autoscale(bad)
