"""Headers-exchange matching with RabbitMQ's semantics (rabbit_exchange_type_headers).

x-match: ``all`` (default, also for an unknown or non-string value), ``any``,
``all-with-x``, ``any-with-x``. Binding keys starting with ``x-`` are ignored unless
a ``-with-x`` mode is used (``x-match`` itself is always ignored). A void (None)
binding value only requires the header to be present. Values compare as Erlang
``=:=``: ``True`` is not ``1``, ``1`` is not ``1.0``, a str equals its UTF-8 bytes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from meta.amqp_values import erlang_term

# RabbitMQ turns message-header timestamps into milliseconds for routing
# (mc_amqpl:routing_value/2) but not binding arguments; we mirror that quirk.
_HEADER_TIMESTAMP_SCALE = 1000
_PRESENCE = object()  # marker: a void binding value, only presence is checked


def header_terms(headers: Mapping[str, Any] | None) -> dict[str, Any]:
    """Message headers as comparable terms; compute once per message."""
    if not headers:
        return {}
    return {
        key: erlang_term(value, timestamp_scale=_HEADER_TIMESTAMP_SCALE)
        for key, value in headers.items()
    }


class HeadersMatcher:
    """One headers binding's arguments, compiled for repeated matching."""

    __slots__ = ("conditions", "match_any")

    def __init__(self, arguments: Mapping[str, Any]) -> None:
        mode = arguments.get("x-match")
        mode = mode if isinstance(mode, str) else "all"
        self.match_any = mode in ("any", "any-with-x")
        include_x = mode in ("all-with-x", "any-with-x")
        conditions: list[tuple[str, Any]] = []
        for key, value in arguments.items():
            if key == "x-match" or (key.startswith("x-") and not include_x):
                continue
            conditions.append((key, _PRESENCE if value is None else erlang_term(value)))
        self.conditions = tuple(conditions)

    def matches(self, terms: Mapping[str, Any]) -> bool:
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


def headers_match(binding_arguments: Mapping[str, Any], headers: Mapping[str, Any] | None) -> bool:
    """Convenience one-shot form of HeadersMatcher(...).matches(header_terms(...))."""
    return HeadersMatcher(binding_arguments).matches(header_terms(headers))
