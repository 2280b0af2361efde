"""Depth breakers (policy key ``breaker``), after DeFiBus's ``rejectSendWhenMaxDepth``:

    "breaker": {"high": 0.7, "low": 0.5, "of": "max-length" | N, "action": "reject" | "block"}

When a queue's depth (ready messages, as ``x-max-length`` counts them) passes ``high`` times
the measure (the queue's ``x-max-length``, or N messages), publishes to it are nacked
(``reject``) or its publishers held by flow control (``block``) until the depth falls below
``low`` times the measure. Every key may be left out: 0.7, 0.5, "max-length", "reject".
Validated here, as PUT /api/policies checks a policy; applied by gateway/queues/breaker.py.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

BREAKER_KEY = "breaker"
ACTIONS = ("reject", "block")
MAX_LENGTH = "max-length"
DEFAULT_HIGH = 0.7
DEFAULT_LOW = 0.5
KEYS = ("high", "low", "of", "action")


class BreakerInvalid(ValueError):
    """A ``breaker`` value that is not a breaker (the policy API's 400 with this reason)."""


@dataclass(frozen=True, slots=True)
class BreakerSpec:
    high: float = DEFAULT_HIGH
    low: float = DEFAULT_LOW
    of: int | None = None  # None: the queue's x-max-length
    action: str = "reject"

    def bounds(self, max_length: int | None) -> tuple[int, int] | None:
        """(trip at a depth above this, reset below this) in messages; None when measured
        against an x-max-length the queue does not have."""
        measure = self.of if self.of is not None else max_length
        if measure is None:
            return None
        return max(0, math.floor(self.high * measure)), max(0, math.ceil(self.low * measure))


def _fraction(spec: Mapping[str, Any], key: str, default: float) -> float:
    value = spec.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 1:
        raise BreakerInvalid(f"breaker '{key}' must be a number above 0 and at most 1, "
                             f"not {value!r}")  # fmt: skip
    return float(value)


def parse_breaker(value: Any) -> BreakerSpec:
    """The spec a policy's ``breaker`` value says (BreakerInvalid with the reason)."""
    if not isinstance(value, Mapping):
        raise BreakerInvalid(f"policy key '{BREAKER_KEY}' must be an object, not {value!r}")
    unknown = sorted(set(value) - set(KEYS))
    if unknown:
        raise BreakerInvalid(f"breaker keys are {', '.join(KEYS)}; unknown: {', '.join(unknown)}")
    high = _fraction(value, "high", DEFAULT_HIGH)
    low = _fraction(value, "low", min(DEFAULT_LOW, high))
    if low > high:
        raise BreakerInvalid(f"breaker 'low' ({low}) must not be above 'high' ({high})")
    of = value.get("of", MAX_LENGTH)
    if of != MAX_LENGTH and (isinstance(of, bool) or not isinstance(of, int) or of < 1):
        raise BreakerInvalid(f"breaker 'of' must be \"{MAX_LENGTH}\" or a positive number of "
                             f"messages, not {of!r}")  # fmt: skip
    action = value.get("action", "reject")
    if action not in ACTIONS:
        raise BreakerInvalid(f"breaker 'action' must be one of {', '.join(ACTIONS)}, "
                             f"not {action!r}")  # fmt: skip
    return BreakerSpec(high, low, None if of == MAX_LENGTH else of, action)


def breaker_of(policy: Mapping[str, Any] | None) -> BreakerSpec | None:
    """The breaker of a policy definition in force (already validated), or None."""
    if policy is None or BREAKER_KEY not in policy:
        return None
    try:
        return parse_breaker(policy[BREAKER_KEY])
    except BreakerInvalid:  # set before validation existed: no breaker rather than a crash
        return None
