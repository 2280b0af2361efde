"""Headers-exchange matching with RabbitMQ 3.10's semantics (rabbit_exchange_type_headers).

x-match: ``all`` (default, also for an unknown or non-string value), ``any``,
``all-with-x``, ``any-with-x``. Binding keys starting with ``x-`` are ignored unless
a ``-with-x`` mode is used (``x-match`` itself is always ignored). A void (None)
binding value only requires the header to be present. Values compare as field_terms.py
explains: by value across numeric types, with their wire types inside tables and arrays.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any

from gateway.routing.field_terms import (
    Buffer,
    Term,
    headers_table_at,
    table_terms,
    value_term,
    wire_term,
)

_PRESENCE = ("presence",)  # marker: a void binding value, only presence is checked


def header_terms(
    headers: Mapping[str, Any] | None, properties: Buffer | None = None
) -> dict[str, Term]:
    """Message headers as comparable terms; compute once per message. From the raw
    ``properties`` when given (the wire types of nested values), else from ``headers``."""
    if properties is not None and headers:
        try:
            start = headers_table_at(properties)
            if start is not None:
                return table_terms(properties, start)
        except (ValueError, IndexError):
            pass  # the decoded headers below are what routing had before
    if not headers:
        return {}
    return {key: value_term(value) for key, value in headers.items()}


class HeadersMatcher:
    """One headers binding's arguments, compiled for repeated matching.

    ``wire``: base64 of arguments as the client sent them (type code first), for what
    decoding loses: nested types, large timestamps (BindingDef.argument_wire)."""

    __slots__ = ("conditions", "match_any")

    def __init__(self, arguments: Mapping[str, Any], wire: Mapping[str, str] | None = None) -> None:
        mode = arguments.get("x-match")
        mode = mode if isinstance(mode, str) else "all"
        self.match_any = mode in ("any", "any-with-x")
        include_x = mode in ("all-with-x", "any-with-x")
        conditions: list[tuple[str, Term]] = []
        for key, value in arguments.items():
            if key == "x-match" or (key.startswith("x-") and not include_x):
                continue
            conditions.append((key, _PRESENCE if value is None else _term(key, value, wire)))
        self.conditions = tuple(conditions)

    def matches(self, terms: Mapping[str, Term]) -> bool:
        """``terms`` as built by header_terms()."""
        missing = _PRESENCE  # a value no term can equal
        if self.match_any:
            for key, expected in self.conditions:
                if key in terms if expected is _PRESENCE else terms.get(key, missing) == expected:
                    return True
            return False
        for key, expected in self.conditions:
            if expected is _PRESENCE:
                if key not in terms:
                    return False
            elif terms.get(key, missing) != expected:
                return False
        return True


def _term(key: str, value: Any, wire: Mapping[str, str] | None) -> Term:
    raw = wire.get(key) if wire else None
    if raw is not None:
        try:
            return wire_term(base64.b64decode(raw))
        except ValueError:  # binascii.Error included
            pass  # not what the client sent after all: the decoded value stands
    return value_term(value)


def headers_match(
    binding_arguments: Mapping[str, Any],
    headers: Mapping[str, Any] | None,
    properties: Buffer | None = None,
) -> bool:
    """Convenience one-shot form of HeadersMatcher(...).matches(header_terms(...))."""
    return HeadersMatcher(binding_arguments).matches(header_terms(headers, properties))
