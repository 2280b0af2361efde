"""The delivery-mode fast path agrees with pamqp's full decode for every property layout."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from pamqp import commands

from gateway.amqp import decode_properties, frame_writer
from gateway.sessions.publishing import _delivery_mode

properties = st.builds(
    commands.Basic.Properties,
    content_type=st.none() | st.text(max_size=40),
    content_encoding=st.none() | st.text(max_size=10),
    headers=st.none()
    | st.dictionaries(
        st.text(min_size=1, max_size=10), st.integers(-1000, 1000) | st.text(max_size=30)
    ),
    delivery_mode=st.none() | st.sampled_from([1, 2]),
    priority=st.none() | st.integers(0, 9),
    correlation_id=st.none() | st.text(max_size=20),
)


@given(properties)
def test_delivery_mode_fast_path_matches_the_full_decode(props: commands.Basic.Properties) -> None:
    raw = frame_writer.encode_properties(props)
    flags = int.from_bytes(raw[:2], "big")
    expected = decode_properties(raw).delivery_mode
    if expected is None:
        assert not flags & 0x1000
    else:
        assert _delivery_mode(raw, flags) == expected


def test_truncated_properties_fall_back_to_the_decoder() -> None:
    raw = frame_writer.encode_properties(
        commands.Basic.Properties(content_type="x" * 50, delivery_mode=2)
    )
    assert _delivery_mode(raw[:10], int.from_bytes(raw[:2], "big")) == -1
