"""The compiled twins of the hot paths (storage/twins.py, speedups/mqgw_speedups/) against
the pure ones.

The package's build compiles the twins (setup.py; in place for scripts/setup's editable
install); these tests fail if it did not (the build warns and carries on, pure Python only, so
this is where a broken build shows). Then: the module in use is the one the
environment asks for, and pure and compiled give the same result or raise the same exception
type on random input, valid and broken.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pamqp import commands

from gateway.amqp import deliver_frame, frame_reader, frame_writer, publish_cut
from gateway.amqp.channel import decode_publish
from gateway.amqp.errors import FrameError
from gateway.amqp.methods import decode_method
from storage import twins
from tests.gateway.amqp.helpers import frame, publish
from tests.harness.processes import REPO
from tests.harness.twins import built_twin

PROPERTY = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def compiled(pure: ModuleType) -> ModuleType:
    twin: ModuleType = built_twin(pure)
    return twin


@pytest.mark.parametrize(
    ("pure", "name", "bound"),
    [
        (publish_cut, "cut_publish", lambda: frame_reader.cut_publish),
        (publish_cut, "cut_inbound", lambda: frame_reader.cut_inbound),
        (deliver_frame, "deliver_one_write", lambda: frame_writer.deliver_one_write),
    ],
    ids=["publish_cut", "publish_cut_batch", "deliver_frame"],
)
def test_compiled_twin_is_built_and_in_use_unless_pure_is_forced(
    pure: ModuleType, name: str, bound: Callable[[], object]
) -> None:
    twin = compiled(pure)
    assert twin.__name__ == f"mqgw_speedups.{pure.__name__.rpartition('.')[2]}"
    assert twin.__file__ is not None
    assert twin.__file__.endswith(".so")  # an extension module, not a copy of the source
    chosen = pure if twins.pure_forced() else twin
    assert bound() is getattr(chosen, name)
    expected = "pure" if twins.pure_forced() else "compiled"
    assert twins.in_use()[pure.__name__.rpartition(".")[2]] == expected


def test_every_compiled_twin_is_a_hot_module_with_a_pure_one() -> None:
    """status() and `mqgw --version` check HOT_MODULES: each .pyx the build compiles."""
    sources = sorted(path.stem for path in (REPO / "speedups" / "mqgw_speedups").glob("*.pyx"))
    assert sorted(twins.HOT_MODULES) == sources
    for name, pure in twins.HOT_MODULES.items():
        assert pure.rpartition(".")[2] == name  # pick() finds a twin by its pure module's name
        assert (REPO / Path(*pure.split("."))).with_suffix(".py").is_file()


def test_pure_is_forced_by_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(twins.PURE_ENV, "1")
    assert twins.twin(publish_cut) is publish_cut
    monkeypatch.setenv(twins.PURE_ENV, "0")
    assert twins.twin(publish_cut) is compiled(publish_cut)


def outcome(function: Callable[..., Any], *args: Any) -> tuple[str, Any]:
    try:
        return "value", function(*args)
    except Exception as error:  # the same exception type is what the twins must agree on
        return "raised", type(error)


# -- publish_cut ------------------------------------------------------------------------------

OTHER_FRAMES = [
    frame(1, commands.Basic.Ack(delivery_tag=1)),
    # A tag with its top bit set: pamqp reads a long-long signed, and so must the fast path.
    b"\x01\x00\x02\x00\x00\x00\x0d\x00\x3c\x00\x50" + b"\xff" * 8 + b"\x03\xce",
    frame(3, commands.Basic.Ack(delivery_tag=7, multiple=True))[:-1] + b"\x00",  # bad end
    frame(2, commands.Channel.Open()),
    b"\x08\x00\x00\x00\x00\x00\x00\xce",  # heartbeat
]


@st.composite
def publish_streams(draw: st.DrawFn) -> bytes:
    """Whole publishes and other frames, then bytes flipped, cut off or added."""
    pieces = draw(
        st.lists(
            st.one_of(
                st.builds(
                    lambda channel, body, key: publish(
                        channel, body, routing_key=key, frame_max=draw(st.sampled_from([64, 4096]))
                    ),
                    st.integers(0, 3),
                    st.binary(max_size=300),
                    st.text(max_size=4),
                ),
                st.sampled_from(OTHER_FRAMES),
                st.binary(max_size=30),
            ),
            max_size=4,
        )
    )
    data = bytearray(b"".join(pieces))
    for _ in range(draw(st.integers(0, 3))):
        if data:
            data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
    return bytes(data[: draw(st.integers(0, len(data)))])


@PROPERTY
@given(
    data=publish_streams(),
    pos=st.integers(-3, 400),
    frame_max=st.one_of(st.sampled_from([0, 11, 12, 64, 4096, 131072]), st.integers(-5, 1 << 33)),
    refused=st.sets(st.integers(0, 3)),
)
def test_cut_publish_twins_agree(data: bytes, pos: int, frame_max: int, refused: set[int]) -> None:
    asked: dict[str, list[int]] = {"pure": [], "compiled": []}

    def accept(who: str) -> Callable[[int], bool]:
        def ask(channel: int) -> bool:
            asked[who].append(channel)
            return channel not in refused

        return ask

    pure = outcome(publish_cut.cut_publish, bytearray(data), pos, frame_max, accept("pure"))
    twin = compiled(publish_cut).cut_publish
    assert outcome(twin, bytearray(data), pos, frame_max, accept("compiled")) == pure
    assert asked["compiled"] == asked["pure"]


def test_cut_publish_twins_agree_on_a_stream_of_publishes() -> None:
    data = bytearray(b"".join(publish(1, bytes([n]) * n, routing_key="q") for n in range(1, 60)))
    cuts: dict[str, list[Any]] = {}
    for name, cut in (
        ("pure", publish_cut.cut_publish),
        ("compiled", compiled(publish_cut).cut_publish),
    ):
        pos, cuts[name] = 0, []
        while (found := cut(data, pos, 131072, lambda _channel: True)) is not None:
            pos, frames = found
            cuts[name].append(frames)
        assert pos == len(data)
    assert len(cuts["compiled"]) == 59
    assert cuts["compiled"] == cuts["pure"]
    assert cuts["compiled"][3].body == b"\x04" * 4


@PROPERTY
@given(
    data=publish_streams(),
    pos=st.integers(-3, 400),
    frame_max=st.one_of(st.sampled_from([0, 12, 64, 4096, 131072]), st.integers(-5, 1 << 33)),
    max_body=st.one_of(st.sampled_from([0, 5, 100, 1 << 20]), st.integers(-5, 1 << 63)),
    refused=st.sets(st.integers(0, 3)),
)
def test_cut_inbound_twins_agree(
    data: bytes, pos: int, frame_max: int, max_body: int, refused: set[int]
) -> None:
    asked: dict[str, list[int]] = {"pure": [], "compiled": []}
    results = {}
    for name, module in (("pure", publish_cut), ("compiled", compiled(publish_cut))):

        def ask(channel: int, who: str = name) -> bool:
            asked[who].append(channel)
            return channel not in refused

        out: list[tuple[Any, ...]] = []
        args = (bytearray(data), pos, frame_max, max_body, ask, _publish, _ack, out)
        results[name] = (outcome(module.cut_inbound, *args), out)
    assert results["compiled"] == results["pure"]
    assert asked["compiled"] == asked["pure"]


def test_cut_inbound_is_cut_publish_decode_publish_and_pamqps_ack_in_a_loop() -> None:
    """The batch cut gives, frame by frame, what cut_publish and the channel's decode_publish
    give for publishes and what pamqp decodes for acks, asks accept once per channel, and
    stops at a body over max_body."""
    stream = []
    for n in range(1, 40):
        stream.append(publish(1 + n % 2, bytes([n]) * n, routing_key=f"k{n}"))
        if n % 3 == 0:
            stream.append(frame(2, commands.Basic.Ack(delivery_tag=n << 40, multiple=n % 2 == 1)))
    data = bytearray(b"".join(stream) + publish(1, b"x" * 50) + publish(1, b"after"))
    expected, pos = [], 0
    while pos < len(data):
        cut = publish_cut.cut_publish(data, pos, 131072, lambda _c: True)
        if cut is None:
            end = pos + 21
            method = decode_method(bytes(data[pos + 7 : end - 1]))
            expected.append(("ack", data[pos + 2], method.delivery_tag, method.multiple))
            pos = end
            continue
        pos, (channel, method, properties, body) = cut
        expected.append(("publish", channel, *decode_publish(method), properties, body))
    assert len(expected) == 41 + 13
    for module in (publish_cut, compiled(publish_cut)):
        asked: list[int] = []
        out: list[tuple[Any, ...]] = []
        ask = _recorder(asked)
        end = module.cut_inbound(data, 0, 131072, 49, ask, _publish, _ack, out)
        assert out == expected[:-2]
        assert end == len(b"".join(stream))  # before the body of 50
        assert asked == [2, 1]


def _publish(*fields: Any) -> tuple[Any, ...]:
    return ("publish", *fields)


def _ack(*fields: Any) -> tuple[Any, ...]:
    return ("ack", *fields)


def _recorder(asked: list[int]) -> Callable[[int], bool]:
    def ask(channel: int) -> bool:
        asked.append(channel)
        return True

    return ask


@PROPERTY
@given(
    method=st.one_of(
        st.binary(max_size=20),
        st.builds(
            lambda exchange, key, bits, tail: (
                b"\x00\x3c\x00\x28\x00\x00"
                + bytes([len(exchange)])
                + exchange
                + bytes([len(key)])
                + key
                + bits
                + tail
            ),
            st.binary(max_size=6) | st.sampled_from([b"amq.direct", "é".encode(), b"\xff"]),
            st.binary(max_size=6),
            st.binary(max_size=1),
            st.binary(max_size=2),
        ),
    )
)
def test_publish_head_is_decode_publish_or_none_where_it_raises(method: bytes) -> None:
    head = publish_cut.publish_head(method)
    if head is None:
        with pytest.raises(FrameError):
            decode_publish(method)
    else:
        assert head == tuple(decode_publish(method))
    assert compiled(publish_cut).publish_head(method) == head


# -- deliver_frame -----------------------------------------------------------------------------

NAMES = st.one_of(
    st.text(max_size=8),
    st.binary(max_size=8),
    st.text(min_size=250, max_size=260),
    st.sampled_from(["\ud800", "é" * 128, bytearray(b"ba"), 7]),
)


def buffers(max_size: int) -> st.SearchStrategy[Any]:
    raw = st.binary(max_size=max_size)
    return st.one_of(
        raw,
        raw.map(bytearray),
        raw.map(lambda data: memoryview(b"head" + data)[4:]),
        raw.map(lambda data: memoryview(data.ljust(4, b"\0")[:4]).cast("i")),
        st.sampled_from([None, "text"]),
    )


@PROPERTY
@given(
    channel=st.one_of(st.integers(0, 65535), st.integers(-2, 70000), st.just(True)),
    consumer_tag=NAMES,
    delivery_tag=st.one_of(st.integers(0, 1 << 64), st.integers(-2, 2)),
    redelivered=st.one_of(st.booleans(), st.sampled_from([0, 2, "", "x"])),
    exchange=NAMES,
    routing_key=NAMES,
    properties=buffers(40),
    body=buffers(300),
    frame_max=st.one_of(st.sampled_from([8, 64, 4096, 131072]), st.integers(-5, 1 << 33)),
)
def test_deliver_one_write_twins_agree(
    channel: Any,
    consumer_tag: Any,
    delivery_tag: int,
    redelivered: Any,
    exchange: Any,
    routing_key: Any,
    properties: Any,
    body: Any,
    frame_max: int,
) -> None:
    args: tuple[Any, ...] = (channel, consumer_tag, delivery_tag, redelivered, exchange)
    args += (routing_key, properties, body, frame_max)
    twin = compiled(deliver_frame).deliver_one_write
    assert outcome(twin, *args) == outcome(deliver_frame.deliver_one_write, *args)


def test_deliver_one_write_twins_agree_on_a_typical_delivery() -> None:
    stored = memoryview(b"..\x90\x00\x10text/plain\x02" + b"body" * 30)
    args = (1, "amq.ctag-1", 12345, True, "amq.direct", "key.é", stored[2:16], stored[16:], 4096)
    written = compiled(deliver_frame).deliver_one_write(*args)
    assert written == deliver_frame.deliver_one_write(*args)
    assert written is not None
    assert written.endswith(b"body\xce")
