"""A small blocking AMQP client on pamqp frames, for what pika and aiormq hide.

Neither pika nor aiormq reports the class/method id of a channel.close or connection.close,
and neither sends arbitrary property bytes or field-table types (u, i, f, B...). This client
does: it speaks frames directly and reports every server frame as plain data.
"""

from __future__ import annotations

import socket
import struct
import time
from dataclasses import dataclass, field
from typing import Any

from pamqp import base, commands, exceptions, frame, header

from gateway.amqp import frame_writer, unchecked

FRAME_END = b"\xce"


@dataclass
class Message:
    """A method that carries content (deliver, get-ok, return) with its header and body."""

    method: base.Frame
    properties: commands.Basic.Properties
    raw_properties: bytes  # property flags + values, exactly as the server sent them
    body: bytes = b""
    body_frames: int = 0


@dataclass
class RawClient:
    port: int
    vhost: str = "/"
    frame_max: int = 131072
    capabilities: dict[str, bool] = field(
        default_factory=lambda: {
            "publisher_confirms": True,
            "consumer_cancel_notify": True,
            "basic.nack": True,
            "exchange_exchange_bindings": True,
        }
    )
    timeout_s: float = 5.0
    username: str = "guest"
    password: str = "guest"
    channel_max: int = 0  # 0: what the server proposes

    def __post_init__(self) -> None:
        self.sock = socket.create_connection(("127.0.0.1", self.port), timeout=self.timeout_s)
        self.buffer = b""
        self.pending: list[tuple[int, Any]] = []  # frames read ahead of a wait
        self.closed: tuple[int, base.Frame] | None = None
        self.start: base.Frame | None = None  # the server's connection.start

    # -- handshake ------------------------------------------------------------------------

    def connect(self) -> base.Frame:
        """Open the connection; returns Connection.OpenOk or the server's close."""
        self.sock.sendall(header.ProtocolHeader().marshal())
        self.start = self.wait_method(0, commands.Connection.Start)
        self.send(
            0,
            commands.Connection.StartOk(
                client_properties={"product": "mqgw-diff", "capabilities": self.capabilities},
                mechanism="PLAIN",
                response=f"\0{self.username}\0{self.password}",
            ),
        )
        tune = self.wait_method(0, commands.Connection.Tune)
        assert isinstance(tune, commands.Connection.Tune)
        self.frame_max = min(self.frame_max, tune.frame_max or self.frame_max)
        channel_max = self.channel_max or tune.channel_max
        self.send(0, commands.Connection.TuneOk(channel_max, self.frame_max, 0))
        self.send(0, commands.Connection.Open(self.vhost))
        return self.next_method(0)

    def close(self) -> None:
        try:
            if self.closed is None:
                self.send(0, commands.Connection.Close(200, "bye", 0, 0))
                self.next_method(0, timeout_s=2)
        except (OSError, TimeoutError, ConnectionError):
            pass
        self.sock.close()

    def __enter__(self) -> RawClient:
        self.connect()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    # -- sending --------------------------------------------------------------------------

    def send(self, channel: int, method: base.Frame) -> None:
        # The server's encoder: any UTF-8 name, which pamqp's own refuses (its ASCII pattern).
        self.sock.sendall(frame_writer.method(channel, method))

    def send_frame(self, kind: int, channel: int, payload: bytes) -> None:
        """Any frame, well-formed or not (for the protocol-error scenarios)."""
        self.sock.sendall(struct.pack(">BHI", kind, channel, len(payload)) + payload + FRAME_END)

    def open_channel(self, channel: int = 1) -> None:
        self.send(channel, commands.Channel.Open())
        self.wait_method(channel, commands.Channel.OpenOk)

    def rpc(self, channel: int, method: base.Frame) -> Any:
        """Send; return the next method or message on that channel (the reply, or a close)."""
        self.send(channel, method)
        return self.next_item(channel)

    def publish(
        self,
        channel: int,
        exchange: str,
        routing_key: str,
        body: bytes = b"",
        properties: commands.Basic.Properties | None = None,
        *,
        raw_properties: bytes | None = None,
        mandatory: bool = False,
        immediate: bool = False,
    ) -> None:
        method = unchecked.build(
            commands.Basic.Publish,
            exchange=exchange,
            routing_key=routing_key,
            mandatory=mandatory,
            immediate=immediate,
        )
        data = [frame_writer.method(channel, method)]
        if raw_properties is None:
            content = header.ContentHeader(0, len(body), properties or commands.Basic.Properties())
            data.append(frame.marshal(content, channel))
        else:
            payload = struct.pack(">HHQ", 60, 0, len(body)) + raw_properties
            data.append(struct.pack(">BHI", 2, channel, len(payload)) + payload + FRAME_END)
        chunk = self.frame_max - 8
        view = memoryview(body)
        for start in range(0, len(body), chunk):
            piece = view[start : start + chunk]
            data += (struct.pack(">BHI", 3, channel, len(piece)), piece, FRAME_END)
        self.sock.sendall(b"".join(data))

    # -- receiving ------------------------------------------------------------------------

    def _read_frame(self, deadline: float) -> tuple[int, int, bytes]:
        """(type, channel, payload) of the next frame off the socket."""
        while True:
            if len(self.buffer) >= 7:
                kind, channel, size = struct.unpack_from(">BHI", self.buffer)
                if len(self.buffer) >= size + 8:
                    payload = self.buffer[7 : 7 + size]
                    self.buffer = self.buffer[size + 8 :]
                    return kind, channel, payload
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("no frame from the server")
            self.sock.settimeout(remaining)
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                raise TimeoutError("no frame from the server") from None
            except ConnectionResetError:
                data = b""
            if not data:
                raise ConnectionError("server closed the socket")
            self.buffer += data

    def _read_item(self, deadline: float) -> tuple[int, Any]:
        """A method, or a content-carrying method with its content, as (channel, item)."""
        while True:
            kind, channel, payload = self._read_frame(deadline)
            if kind == 8:
                continue  # heartbeat
            assert kind == 1, f"unexpected frame type {kind}"
            method = _decode_method(kind, channel, payload)
            if isinstance(method, commands.Connection.Close):
                self.closed = (channel, method)
                self.send(0, commands.Connection.CloseOk())
            if not isinstance(
                method, commands.Basic.Deliver | commands.Basic.GetOk | commands.Basic.Return
            ):
                return channel, method
            kind, _, payload = self._read_frame(deadline)
            assert kind == 2
            size = struct.unpack_from(">Q", payload, 4)[0]
            content = frame.unmarshal(
                struct.pack(">BHI", 2, channel, len(payload)) + payload + FRAME_END
            )
            message = Message(method, content[2].properties, payload[12:])
            while len(message.body) < size:
                kind, _, payload = self._read_frame(deadline)
                assert kind == 3
                message.body += payload
                message.body_frames += 1
            return channel, message

    def next_item(self, channel: int, timeout_s: float | None = None) -> Any:
        """The next method or message on ``channel`` (connection.close counts on any)."""
        for index, (number, item) in enumerate(self.pending):
            if number == channel or isinstance(item, commands.Connection.Close):
                del self.pending[index]
                return item
        deadline = time.monotonic() + (self.timeout_s if timeout_s is None else timeout_s)
        while True:
            number, item = self._read_item(deadline)
            if number == channel or isinstance(item, commands.Connection.Close):
                return item
            self.pending.append((number, item))

    def next_method(self, channel: int, timeout_s: float | None = None) -> base.Frame:
        item = self.next_item(channel, timeout_s)
        assert not isinstance(item, Message), f"expected a method, got {item}"
        return item  # type: ignore[no-any-return]

    def wait_method(self, channel: int, kind: type[base.Frame]) -> base.Frame:
        method = self.next_method(channel)
        assert isinstance(method, kind), f"expected {kind.__name__}, got {method}"
        return method

    def drain(self, channel: int, timeout_s: float = 0.3) -> list[Any]:
        """Everything the server sends on ``channel`` until it is quiet for ``timeout_s``."""
        items = []
        while self.closed is None:
            try:
                items.append(self.next_item(channel, timeout_s))
            except TimeoutError:
                break
            except ConnectionError:
                items.append("socket closed")
                break
        return items


def _decode_method(kind: int, channel: int, payload: bytes) -> base.Frame:
    """pamqp's decoding, except for a close whose reply text RabbitMQ cut inside a UTF-8
    character (it cuts at 252 bytes): that text is kept with surrogate escapes, so that
    equal bytes compare equal."""
    raw = struct.pack(">BHI", kind, channel, len(payload)) + payload + FRAME_END
    try:
        return frame.unmarshal(raw)[2]  # type: ignore[no-any-return]
    except exceptions.UnmarshalingException:
        index = struct.unpack_from(">I", payload)[0]
        close_class = {c.index: c for c in (commands.Channel.Close, commands.Connection.Close)}
        if index not in close_class:
            raise
    code, length = struct.unpack_from(">HB", payload, 4)
    text = payload[7 : 7 + length].decode("utf-8", "surrogateescape")
    class_id, method_id = struct.unpack_from(">HH", payload, 7 + length)
    return unchecked.build(
        close_class[index],
        reply_code=code,
        reply_text=text,
        class_id=class_id,
        method_id=method_id,
    )


def describe_close(method: base.Frame) -> tuple[str, int, str, int, int]:
    """A channel.close or connection.close as comparable data."""
    assert isinstance(method, commands.Channel.Close | commands.Connection.Close), method
    kind = "channel" if isinstance(method, commands.Channel.Close) else "connection"
    return (kind, method.reply_code, method.reply_text, method.class_id, method.method_id)
