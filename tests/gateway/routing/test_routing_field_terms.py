"""Field values as RabbitMQ 3.10's headers exchange compares them (gateway/routing/
field_terms.py); tests/diff/test_diff_headers.py compares the same rules with RabbitMQ."""

from __future__ import annotations

import base64
from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pamqp import decode

from gateway.routing.field_terms import table_terms, value_term, wire_term
from gateway.routing.headers_match import HeadersMatcher, header_terms
from tests.diff.field_tables import W, encode_table, encode_value, properties_with_headers

_SCALAR = st.one_of(
    st.builds(W, st.sampled_from("bBsuIil"), st.integers(0, 100)),
    st.builds(W, st.sampled_from("fd"), st.sampled_from([0.0, 0.5, 1.0, -2.25])),
    st.builds(W, st.just("t"), st.booleans()),
    st.builds(W, st.sampled_from("Sx"), st.text(max_size=3)),
    st.builds(W, st.just("T"), st.integers(0, 2**40)),
    st.builds(W, st.just("D"), st.sampled_from(["1", "1.5", "1.50", "20"])),
    st.just(W("V", None)),
)
_VALUE = st.recursive(
    _SCALAR,
    lambda inner: st.one_of(
        st.builds(W, st.just("F"), st.dictionaries(st.text(max_size=2), inner, max_size=3)),
        st.builds(W, st.just("A"), st.lists(inner, max_size=3)),
    ),
    max_leaves=8,
)


def _matcher(arguments: dict[str, W]) -> HeadersMatcher:
    """A binding as the gateway holds one made over AMQP: pamqp's values, and the wire
    bytes of its tables and arrays."""
    decoded = decode.field_table(encode_table(arguments))[1]
    wire = {
        key: base64.b64encode(encode_value(item)).decode()
        for key, item in arguments.items()
        if item.code in "FATD"
    }
    return HeadersMatcher(decoded, wire)


def _headers(headers: dict[str, W]) -> dict[str, object]:
    properties = properties_with_headers(headers)
    return header_terms(decode.field_table(encode_table(headers))[1], properties)


@settings(max_examples=300, deadline=None)
@given(_VALUE)
def test_a_value_matches_itself_sent_with_the_same_types(item: W) -> None:
    if item.code == "V":
        return  # a void binding value only asks for presence
    assert _matcher({"k": item}).matches(_headers({"k": item}))


@settings(max_examples=300, deadline=None)
@given(_VALUE)
def test_the_wire_term_of_a_json_typed_value_is_its_decoded_terms(item: W) -> None:
    """Values typed as RabbitMQ's JSON import types them (long, double, longstr, ...) give
    the same term whether read from the wire or from pamqp's decoded value."""

    def retype(value: W) -> W:
        code = {"b": "l", "B": "l", "s": "l", "u": "l", "I": "l", "i": "l", "f": "d"}
        if value.code == "F":
            return W("F", {k: retype(v) for k, v in value.value.items()})
        if value.code == "A":
            return W("A", [retype(v) for v in value.value])
        if value.code in ("x", "T"):
            return W("S", "t") if value.code == "x" else W("l", value.value)
        return W(code.get(value.code, value.code), value.value)

    typed = retype(item)
    decoded = decode.field_table(encode_table({"k": typed}))[1]["k"]
    assert wire_term(encode_value(typed)) == value_term(decoded)


@pytest.mark.parametrize(
    ("binding", "header", "expected"),
    [
        (W("l", 1), W("d", 1.0), True),
        (W("l", 1), W("t", True), False),
        (W("T", 5), W("l", 5), True),
        (W("F", {"k": W("l", 1)}), W("F", {"k": W("b", 1)}), False),
        (W("F", {}), W("A", []), True),
        (W("A", [W("d", 1.0)]), W("A", [W("d", 1.0)]), True),
    ],
)
def test_rules(binding: W, header: W, expected: bool) -> None:
    assert _matcher({"k": binding}).matches(_headers({"k": header})) is expected


def test_without_wire_bytes_values_are_typed_as_rabbitmq_json_import_types_them() -> None:
    """Definitions and the admin API give no wire types: int is long, float double."""
    plain = HeadersMatcher({"k": {"n": 1, "f": 1.5, "d": Decimal("1.5"), "s": "x"}})
    sent = {"n": W("l", 1), "f": W("d", 1.5), "d": W("D", "1.5"), "s": W("S", "x")}
    assert plain.matches(_headers({"k": W("F", sent)}))
    sent["n"] = W("I", 1)  # the same number, another type: not the same table
    assert not plain.matches(_headers({"k": W("F", sent)}))


def test_a_header_table_that_does_not_parse_falls_back_to_the_decoded_values() -> None:
    broken = b"\x20\x00\x00\x00\x00\x09"  # headers flag, a table claiming 9 bytes, none
    assert header_terms({"k": 1}, broken) == {"k": value_term(1)}
    with pytest.raises(ValueError, match="bad field"):
        table_terms(broken, 2)
    with pytest.raises(ValueError, match="bad field"):
        wire_term(b"F\x00\x00\x00\x05")
