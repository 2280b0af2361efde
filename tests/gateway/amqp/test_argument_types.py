"""decode_method records the wire types of a method's arguments table (pamqp drops them)."""

from __future__ import annotations

from pamqp import commands, frame

from gateway.amqp.methods import decode_method


def _decode(method: object) -> object:
    return decode_method(frame.marshal(method, 1)[7:-1])


def test_argument_types_follow_the_wire_encoding() -> None:
    arguments = {"ttl": 1000, "big": 2**40, "s": "x", "t": True, "a": [1], "n": {"k": 1},
                 "v": None, "d": 0.5}  # fmt: skip
    decoded = _decode(commands.Queue.Declare(queue="q", arguments=arguments))
    assert decoded.arguments == arguments  # type: ignore[attr-defined]
    assert decoded.argument_types == {  # type: ignore[attr-defined]
        "ttl": "short", "big": "long", "s": "longstr", "t": "bool", "a": "array",
        "n": "table", "v": "void", "d": "float",  # pamqp sends floats as float32
    }  # fmt: skip


def test_methods_without_arguments_carry_no_types() -> None:
    assert not hasattr(_decode(commands.Basic.Consume(queue="q")), "argument_types")
    bind = _decode(commands.Exchange.Bind(destination="d", source="s", arguments={"x": 1}))
    assert bind.argument_types == {"x": "byte"}  # type: ignore[attr-defined]
