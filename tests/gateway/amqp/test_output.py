"""The connection's output: a large body is framed as views of it and written a piece at a
time; a channel's frames can be held back behind a reply (queue.delete-ok first)."""

from __future__ import annotations

import struct

from pamqp import commands

from gateway.amqp import frame_writer
from tests.gateway.amqp.helpers import frame, handshake, open_channel, parse


def test_a_large_body_is_framed_without_copying_and_written_in_pieces() -> None:
    conn = handshake(tune=(2047, 131072, 0))
    open_channel(conn, 1)
    body = bytes(range(256)) * (3 << 14)  # 12 MiB: many frames
    assert conn.send_deliver(1, "c", 1, False, "ex", "rk", b"\x00\x00", body)
    parts = conn.take_output()
    views = [part for part in parts if isinstance(part, memoryview)]
    assert views and all(view.obj is body for view in views)  # slices of the body itself
    writes = list(frame_writer.coalesce(parts, write_bytes=1 << 20))
    assert all(len(write) < (1 << 20) + 131072 for write in writes)
    assert b"".join(writes) == b"".join(parts)
    kinds = _frame_types(b"".join(writes))
    assert kinds[:2] == [1, 2] and set(kinds[2:]) == {3}


def _frame_types(data: bytes) -> list[int]:
    types, offset = [], 0
    while offset < len(data):
        kind, _channel, size = struct.unpack_from(">BHI", data, offset)
        types.append(kind)
        offset += 8 + size
    return types


def test_a_held_channel_sends_the_reply_first() -> None:
    conn = handshake()
    open_channel(conn, 1)
    open_channel(conn, 2)
    conn.hold(1)
    cancel = commands.Basic.Cancel(consumer_tag="mine", nowait=True)
    assert conn.send_method(1, cancel)  # queued behind the reply to come
    assert conn.send_method(2, commands.Basic.Cancel(consumer_tag="other", nowait=True))
    conn.release(1, commands.Queue.DeleteOk(0))
    names = [(channel, method.name) for channel, method in parse(conn.data_to_send())]
    assert names == [(2, "Basic.Cancel"), (1, "Queue.DeleteOk"), (1, "Basic.Cancel")]
    # Released without a reply (the delete failed): what was held goes out as it was.
    conn.hold(1)
    conn.send_method(1, cancel)
    conn.release(1)
    assert conn.data_to_send() == frame(1, cancel)
