"""Automatic scaling of a queue (policy key ``autoscale``, docs/elastic-queues.md):

    "autoscale": {"min": 1, "max": 16, "depth": 10000, "lag_s": 30, "window_s": 30}

The queue grows by one partition when its depth (ready messages) or its consumer lag (age of
its oldest ready message) stays above the bound for ``window_s``; it shrinks by one when it
stays idle (nothing ready, nothing published) for ``window_s``; never outside
[``min``, ``max``], one step at a time. ``depth`` and ``lag_s`` may each be left out (not a
reason to grow), not both. Validated here as PUT /api/policies checks a policy; applied by
gateway/vhost/autoscale.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

AUTOSCALE_KEY = "autoscale"
KEYS = ("min", "max", "depth", "lag_s", "window_s")
MAX_AUTOSCALE = 256
DEFAULT_WINDOW_S = 30.0
DEFAULT_DEPTH = 10_000


class AutoscaleInvalid(ValueError):
    """An ``autoscale`` value that is not one (the policy API's 400 with this reason)."""


@dataclass(frozen=True, slots=True)
class AutoscaleSpec:
    low: int = 1
    high: int = 16
    depth: int | None = DEFAULT_DEPTH
    lag_s: float | None = None
    window_s: float = DEFAULT_WINDOW_S


def _count(value: Any, key: str, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= MAX_AUTOSCALE:
        raise AutoscaleInvalid(f"autoscale '{key}' must be an integer from {low} to "
                               f"{MAX_AUTOSCALE}, not {value!r}")  # fmt: skip
    return value


def _positive(value: Any, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise AutoscaleInvalid(f"autoscale '{key}' must be a positive number, not {value!r}")
    return float(value)


def parse_autoscale(value: Any) -> AutoscaleSpec:
    if not isinstance(value, Mapping):
        raise AutoscaleInvalid(f"policy key '{AUTOSCALE_KEY}' must be an object, not {value!r}")
    unknown = sorted(set(value) - set(KEYS))
    if unknown:
        raise AutoscaleInvalid(f"autoscale keys are {', '.join(KEYS)}; unknown: "
                               f"{', '.join(unknown)}")  # fmt: skip
    low = _count(value.get("min", 1), "min", 1)
    high = _count(value.get("max", 16), "max", 1)
    if low > high:
        raise AutoscaleInvalid(f"autoscale 'min' ({low}) must not be above 'max' ({high})")
    depth = None if value.get("depth") is None else int(_positive(value["depth"], "depth"))
    lag = None if value.get("lag_s") is None else _positive(value["lag_s"], "lag_s")
    if "depth" not in value and "lag_s" not in value:
        depth = DEFAULT_DEPTH
    if depth is None and lag is None:
        raise AutoscaleInvalid("autoscale needs 'depth' or 'lag_s' to know when to grow")
    window = _positive(value.get("window_s", DEFAULT_WINDOW_S), "window_s")
    return AutoscaleSpec(low, high, depth, lag, window)


def autoscale_of(policy: Mapping[str, Any] | None) -> AutoscaleSpec | None:
    if policy is None or AUTOSCALE_KEY not in policy:
        return None
    try:
        return parse_autoscale(policy[AUTOSCALE_KEY])
    except AutoscaleInvalid:
        return None
