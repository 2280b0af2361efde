"""Broker links find a vanished peer by themselves: keepalive probes an idle connection, and
TCP_USER_TIMEOUT closes one whose data stays unacknowledged (a request sent into a partition
would otherwise wait out TCP's doubling retransmission delay after the heal: the nemesis run
saw a slave rejoin its master 12 s late)."""

from __future__ import annotations

import socket

import anyio
import pytest

from storage.clients.link import KEEPALIVE, USER_TIMEOUT_MS, enable_keepalive

pytestmark = [pytest.mark.anyio, pytest.mark.parametrize("anyio_backend", ["asyncio"])]


async def test_a_broker_link_has_short_keepalive_and_a_user_timeout() -> None:
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    async with listener, await anyio.connect_tcp("127.0.0.1", port) as stream:
        enable_keepalive(stream)
        sock = stream.extra(anyio.abc.SocketAttribute.raw_socket)
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        for name, value in KEEPALIVE:
            assert sock.getsockopt(socket.IPPROTO_TCP, getattr(socket, name)) == value
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == USER_TIMEOUT_MS
