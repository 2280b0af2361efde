"""Methods carrying client names are encoded without pamqp's ASCII name pattern
(gateway/amqp/unchecked.py), and still never with more than a shortstr holds."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pamqp import commands, frame

from gateway.amqp import frame_writer
from gateway.amqp.methods import decode_method
from gateway.amqp.unchecked import build

NAMES = st.text(min_size=1).filter(lambda name: len(name.encode()) <= 255)


@given(NAMES)
def test_any_utf8_name_of_a_shortstr_round_trips(name: str) -> None:
    data = frame_writer.method(1, build(commands.Queue.DeclareOk, queue=name,
                                        message_count=1, consumer_count=2))  # fmt: skip
    ok = frame.unmarshal(data)[2]
    assert (ok.queue, ok.message_count, ok.consumer_count) == (name, 1, 2)


@given(NAMES)
def test_a_declare_with_arguments_and_any_name_decodes_with_its_types(name: str) -> None:
    """decode_method re-encodes the fields before the arguments to find them: that must not
    trip pamqp's validation either (it closed the connection with 541)."""
    declare = build(commands.Queue.Declare, queue=name, arguments={"x-message-ttl": 5})
    method = decode_method(frame_writer.method(1, declare)[7:-1])
    assert method.queue == name
    assert method.argument_types == {"x-message-ttl": "byte"}  # pamqp sent the smallest type


def test_a_name_longer_than_a_shortstr_is_never_sent() -> None:
    with pytest.raises(TypeError, match="255"):
        frame_writer.method(1, build(commands.Queue.DeclareOk, queue="ж" * 128))
