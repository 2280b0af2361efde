"""A minimal blocking AMQP 0-9-1 client on a plain socket, for the load generator.

Only setup and teardown go through ``call``/``pipeline`` (pamqp-encoded, replies decoded by
pamqp); the hot loops in publisher.py and consumer.py use ``sock`` and ``parser`` directly.
"""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlparse

from pamqp import commands

from bench.load.frames import PROTOCOL_HEADER, InboundParser, decode, encode, method_id

RECV_BYTES = 1 << 18


class ServerClosed(RuntimeError):
    """The server closed the channel or connection (reply code and text in the message)."""


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int
    user: str
    password: str
    vhost: str

    @classmethod
    def parse(cls, url: str) -> Endpoint:
        parts = urlparse(url)
        vhost = unquote(parts.path[1:]) if len(parts.path) > 1 else "/"
        return cls(
            parts.hostname or "127.0.0.1",
            parts.port or 5672,
            unquote(parts.username or "guest"),
            unquote(parts.password or "guest"),
            vhost,
        )

    @property
    def label(self) -> str:
        return f"{self.host}:{self.port}"


class RawConnection:
    """Handshake (PLAIN), channels, and request/reply for control methods."""

    def __init__(self, url: str, timeout_s: float = 30.0) -> None:
        self.endpoint = Endpoint.parse(url)
        self.sock = socket.create_connection(
            (self.endpoint.host, self.endpoint.port), timeout=timeout_s
        )
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.timeout_s = timeout_s
        self.parser = InboundParser()
        self.frame_max = 131072
        self.server_properties: dict[str, Any] = {}  # connection.start's: product, version...
        self._handshake()

    def _handshake(self) -> None:
        self.sock.sendall(PROTOCOL_HEADER)
        start = self.wait_for(0, commands.Connection.Start)
        self.server_properties = dict(start.server_properties or {})
        credentials = f"\0{self.endpoint.user}\0{self.endpoint.password}"
        start_ok = commands.Connection.StartOk(
            client_properties={"product": "mqgw-bench", "capabilities": {}},
            mechanism="PLAIN",
            response=credentials,
        )
        self.send(encode(start_ok))
        tune = self.wait_for(0, commands.Connection.Tune)
        self.frame_max = tune.frame_max or self.frame_max
        # heartbeat 0: a benchmark must not depend on timers in its own hot loop
        self.send(encode(commands.Connection.TuneOk(tune.channel_max, self.frame_max, 0)))
        self.call(0, commands.Connection.Open(self.endpoint.vhost), commands.Connection.OpenOk)

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def receive(self) -> None:
        """One blocking read into the parser."""
        data = self.sock.recv(RECV_BYTES)
        if not data:
            raise ConnectionError("the server closed the connection")
        self.parser.feed(data)

    def wait_for(self, channel: int, reply: type[Any]) -> Any:
        """Read until ``reply`` arrives on ``channel``; a close from the server raises."""
        return self.wait_for_many(channel, reply, 1)[0]

    def wait_for_many(self, channel: int, reply: type[Any], count: int) -> list[Any]:
        wanted = method_id(reply)
        found: list[Any] = []
        deadline = time.monotonic() + self.timeout_s
        while len(found) < count:
            others = self.parser.others
            while others:
                ch, class_method, whole = others.pop(0)
                method = decode(whole)
                if isinstance(method, commands.Connection.Close | commands.Channel.Close):
                    raise ServerClosed(f"{method.name}: {method.reply_code} {method.reply_text}")
                if ch == channel and class_method == wanted:
                    found.append(method)
            if len(found) >= count:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {reply.name} within {self.timeout_s}s")
            self.receive()
        return found

    def check_others(self) -> None:
        """In a hot loop: a close from the server raises; anything else is dropped."""
        others = self.parser.others
        for _channel, _class_method, whole in others:
            method = decode(whole)
            if isinstance(method, commands.Connection.Close | commands.Channel.Close):
                raise ServerClosed(f"{method.name}: {method.reply_code} {method.reply_text}")
        others.clear()

    def call(self, channel: int, method: Any, reply: type[Any]) -> Any:
        self.send(encode(method, channel))
        return self.wait_for(channel, reply)

    def pipeline(self, channel: int, methods: list[Any], reply: type[Any]) -> None:
        """Send many requests at once, then collect their replies (10k declares in one go)."""
        for start in range(0, len(methods), 1000):
            chunk = methods[start : start + 1000]
            self.send(b"".join(encode(m, channel) for m in chunk))
            self.wait_for_many(channel, reply, len(chunk))

    def open_channel(self, channel: int) -> None:
        self.call(channel, commands.Channel.Open(), commands.Channel.OpenOk)

    def close(self) -> None:
        """Polite close with a short wait; a benchmark's teardown must not hang."""
        try:
            self.sock.settimeout(5)
            self.send(encode(commands.Connection.Close(200, "bye", 0, 0)))
            self.parser.deliveries.clear()
            self.wait_for(0, commands.Connection.CloseOk)
        except (OSError, ServerClosed, TimeoutError, ValueError):
            pass
        finally:
            self.sock.close()
