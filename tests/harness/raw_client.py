"""A raw AMQP client for tests that need byte-level control (fuzz, heartbeats, limits)."""

from __future__ import annotations

import socket
import struct

from pamqp import commands, frame

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"


def read_frames(sock: socket.socket, buffer: bytearray) -> list[object]:
    """Read until at least one whole frame is buffered; returns the decoded frames."""
    while True:
        out = []
        while len(buffer) >= 7:
            size = struct.unpack_from(">I", buffer, 3)[0]
            if len(buffer) < size + 8:
                break
            consumed, _channel, value = frame.unmarshal(bytes(buffer[: size + 8]))
            del buffer[:consumed]
            out.append(value)
        if out:
            return out
        data = sock.recv(65536)
        if not data:
            raise ConnectionError("the server closed the connection")
        buffer += data


def handshake(
    port: int,
    heartbeat_s: int = 0,
    capabilities: dict[str, bool] | None = None,
    seen: list[object] | None = None,
) -> tuple[socket.socket, bytearray]:
    """Open a connection and channel 1 as a client would; returns the socket and its buffer.

    Every frame received on the way is appended to ``seen`` when given.
    """
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    buffer = bytearray()
    frames = seen if seen is not None else []

    def read() -> None:
        frames.extend(read_frames(sock, buffer))

    sock.sendall(PROTOCOL_HEADER)
    read()  # connection.start
    caps = {"authentication_failure_close": True, **(capabilities or {})}
    start_ok = commands.Connection.StartOk(
        client_properties={"capabilities": caps}, mechanism="PLAIN", response="\0guest\0guest"
    )
    sock.sendall(frame.marshal(start_ok, 0))
    read()  # connection.tune
    sock.sendall(frame.marshal(commands.Connection.TuneOk(2047, 131072, heartbeat_s), 0))
    sock.sendall(frame.marshal(commands.Connection.Open("/"), 0))
    read()  # connection.open-ok
    sock.sendall(frame.marshal(commands.Channel.Open(), 1))
    read()  # channel.open-ok
    return sock, buffer
