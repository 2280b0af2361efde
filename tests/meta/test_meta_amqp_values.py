import datetime as dt
from decimal import Decimal

import pytest

from meta.amqp_values import (
    erlang_float,
    erlang_repr,
    erlang_term,
    from_json,
    infer_type,
    to_json,
    type_class,
)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (True, "bool"),
        (5, "long"),
        (1.5, "double"),
        ("s", "longstr"),
        (b"b", "binary"),
        (None, "void"),
        ({}, "table"),
        ([], "array"),
        (Decimal("1.5"), "decimal"),
        (dt.datetime(2024, 1, 1), "timestamp"),
    ],
)
def test_infer_type(value: object, expected: str) -> None:
    assert infer_type(value) == expected


def test_type_classes() -> None:
    assert type_class("signedint") == type_class("long") == type_class("short") == "int"
    assert type_class("float") == type_class("double") == "float"
    assert type_class("longstr") != type_class("binary")


def test_erlang_exact_equality() -> None:
    assert erlang_term(True) != erlang_term(1)
    assert erlang_term(1) != erlang_term(1.0)
    assert erlang_term("abc") == erlang_term(b"abc")
    assert erlang_term(Decimal("1.50")) != erlang_term(Decimal("1.5"))
    assert erlang_term({"a": [1, "x"]}) == erlang_term({"a": [1, b"x"]})


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (1000.0, "1.0e3"),
        (100.0, "100.0"),
        (0.5, "0.5"),
        (1e-5, "1.0e-5"),
        (-2.5, "-2.5"),
        (0.0, "0.0"),
    ],
)
def test_erlang_float(value: float, text: str) -> None:
    assert erlang_float(value) == text


def test_erlang_repr() -> None:
    assert erlang_repr("foo") == '<<"foo">>'
    assert erlang_repr(7) == "7"
    assert erlang_repr(False) == "false"


def test_json_roundtrip_keeps_types() -> None:
    value = {
        "bin": b"\x00\xff",
        "dec": Decimal("3.14"),
        "ts": dt.datetime(2024, 5, 6, 7, 8, 9),
        "nested": {"$amqp": "sneaky", "list": [1, 2.5, None, True, "s"]},
    }
    assert from_json(to_json(value)) == value
