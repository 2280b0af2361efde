"""pamqp methods encoded without pamqp's name validation.

pamqp checks queue and exchange names against the spec's ASCII pattern
(``^[a-zA-Z0-9-_.:@#,/+ ]*$``, and at most 256 characters) when a method is built and again
when it is marshalled, so a queue named ``ключ-队列-✓`` cannot be echoed in queue.declare-ok.
RabbitMQ takes any UTF-8 name that fits a shortstr, and so must we: every method the server
sends is encoded here, and the server builds methods that carry client names with
``build``. pamqp's shortstr encoder still refuses more than 255 bytes, which no decoded
name can exceed.
"""

from __future__ import annotations

from typing import Any, TypeVar

from pamqp import base

F = TypeVar("F", bound=base.Frame)


def _no_validation(_method: base.Frame) -> None:
    return None


_UNVALIDATED: dict[str, type[base.Frame]] = {}


def _unvalidated(cls: type[base.Frame]) -> type[base.Frame]:
    """``cls`` with validate() a no-op. No __slots__ of its own: pamqp encodes the fields
    listed in ``self.__slots__``, which then resolves to ``cls``'s."""
    twin = _UNVALIDATED.get(cls.name)
    if twin is None:
        namespace = {"validate": _no_validation, "__module__": __name__}
        twin = _UNVALIDATED[cls.name] = type(cls.__name__, (cls,), namespace)
    return twin


def build(cls: type[F], **fields: Any) -> F:
    """``cls(**fields)`` for fields pamqp would refuse (names beyond its ASCII pattern)."""
    method = cls()
    for name, value in fields.items():
        setattr(method, name, value)
    return method


def marshal(method: base.Frame) -> bytes:
    """The method's arguments as pamqp encodes them, without its validate()."""
    twin = _unvalidated(type(method))()
    for name in method.__slots__:
        if hasattr(method, name):  # one never set keeps the constructor's default
            setattr(twin, name, getattr(method, name))
    encoded: bytes = twin.marshal()
    return encoded
