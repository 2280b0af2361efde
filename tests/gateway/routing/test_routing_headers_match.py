"""Headers exchange matching tables (rabbit_exchange_type_headers semantics)."""

import datetime as dt
from decimal import Decimal
from typing import Any

import pytest

from gateway.routing.headers_match import headers_match

H = {"format": "pdf", "type": "report", "n": 1, "x-tenant": "acme"}


@pytest.mark.parametrize(
    ("binding", "headers", "expected"),
    [
        ({"x-match": "all", "format": "pdf", "type": "report"}, H, True),
        ({"x-match": "all", "format": "pdf", "type": "log"}, H, False),
        ({"format": "pdf", "type": "log"}, H, False),  # default is all
        ({"x-match": "any", "format": "zip", "type": "report"}, H, True),
        ({"x-match": "any", "format": "zip", "type": "log"}, H, False),
        ({"x-match": "all"}, H, True),  # nothing to check: all matches
        ({"x-match": "any"}, H, False),  # nothing to check: any fails
        ({"x-match": "all"}, None, True),
        ({"x-match": "all", "format": "pdf"}, None, False),
        # x- binding keys are ignored unless -with-x
        ({"x-match": "all", "x-tenant": "other"}, H, True),
        ({"x-match": "any", "x-tenant": "acme"}, H, False),
        ({"x-match": "all-with-x", "x-tenant": "other"}, H, False),
        ({"x-match": "all-with-x", "x-tenant": "acme", "format": "pdf"}, H, True),
        ({"x-match": "any-with-x", "x-tenant": "acme", "format": "zip"}, H, True),
        ({"x-match": "any-with-x", "x-tenant": "nope"}, H, False),
        # void binding value: presence only
        ({"format": None}, H, True),
        ({"missing": None}, H, False),
        ({"x-match": "any", "missing": None, "format": None}, H, True),
        ({"v": None}, {"v": None}, True),
        ({"v": 1}, {"v": None}, False),
        # Erlang == on the values (tests/diff/test_diff_headers.py shows RabbitMQ 3.10 doing it)
        ({"n": 1}, {"n": 1}, True),
        ({"n": 1}, {"n": 1.0}, True),
        ({"n": 1}, {"n": 1.5}, False),
        ({"n": 1}, {"n": True}, False),
        ({"n": True}, {"n": True}, True),
        ({"n": "1"}, {"n": 1}, False),
        ({"s": "abc"}, {"s": b"abc"}, True),  # longstr and binary are both binaries
        ({"d": Decimal("1.5")}, {"d": Decimal("1.5")}, True),
        ({"d": Decimal("1.5")}, {"d": Decimal("1.50")}, False),
        ({"t": {"a": [1, "b"]}}, {"t": {"a": [1, "b"]}}, True),
        ({"t": {"a": [1, "b"]}}, {"t": {"a": [1, "c"]}}, False),
        # an unknown or non-string x-match means all
        ({"x-match": "some", "format": "pdf", "type": "log"}, H, False),
        ({"x-match": b"any", "format": "zip", "type": "report"}, H, False),
        ({"x-match": "any", "format": "zip", "type": "report"}, {"format": "zip"}, True),
    ],
)
def test_headers_table(
    binding: dict[str, Any], headers: dict[str, Any] | None, expected: bool
) -> None:
    assert headers_match(binding, headers) is expected


def test_timestamps_compare_as_their_seconds() -> None:
    # RabbitMQ 3.10 keeps header and binding timestamps in seconds (its 3.13 message
    # containers turned header ones into milliseconds): equal ones match, and a long too.
    when = dt.datetime(2024, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
    assert headers_match({"t": when}, {"t": when})
    assert headers_match({"t": int(when.timestamp())}, {"t": when})
    assert headers_match({"t": None}, {"t": when})
