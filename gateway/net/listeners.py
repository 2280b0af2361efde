"""The AMQP listen addresses: ``amqp_host`` (shared by the plain and the TLS listener).

``amqp_host`` is a comma-separated list of addresses or names ("127.0.0.1,::1"). Empty (the
default) or "*" means every interface, IPv4 and IPv6: two sockets, "0.0.0.0" and "::" with
IPV6_V6ONLY, as RabbitMQ listens, so IPv4 clients keep plain IPv4 peer addresses (not
"::ffff:a.b.c.d", which the loopback check for guest would not recognise). If the host has no
IPv6, the "::" socket is skipped with a warning. A name binds every address it resolves to.
With port 0 every address gets the port the first one was given. ``reuse_port`` sets
SO_REUSEPORT: `mqgw serve --workers N` runs N gateways on one port, the kernel spreading
connections among them.
"""

from __future__ import annotations

import errno
import logging
import socket
from typing import cast

import anyio
from anyio.abc import SocketAttribute, SocketListener, SocketStream
from anyio.streams.stapled import MultiListener

log = logging.getLogger("mqgw.server")

ALL_INTERFACES = ("0.0.0.0", "::")
_NO_IPV6 = (errno.EAFNOSUPPORT, errno.EADDRNOTAVAIL, errno.EPROTONOSUPPORT)


def listen_hosts(setting: str) -> list[str]:
    """The addresses ``amqp_host`` stands for, in binding order."""
    hosts = [part.strip().removeprefix("[").removesuffix("]") for part in setting.split(",")]
    hosts = [host for host in hosts if host]
    if not hosts or hosts == ["*"]:
        return list(ALL_INTERFACES)
    return hosts


def _no_ipv6(error: OSError) -> bool:
    return isinstance(error, socket.gaierror) or error.errno in _NO_IPV6


async def open_listener(
    setting: str, port: int, reuse_port: bool = False
) -> MultiListener[SocketStream]:
    """Listen on every address of ``setting`` (one port for all); OSError if one fails."""
    hosts = listen_hosts(setting)
    wildcard = hosts == list(ALL_INTERFACES)
    listeners: list[SocketListener] = []
    try:
        for host in hosts:
            try:
                multi = await anyio.create_tcp_listener(
                    local_host=host, local_port=port, reuse_port=reuse_port
                )
            except OSError as error:
                if wildcard and host == "::" and listeners and _no_ipv6(error):
                    log.warning("IPv6 unavailable (%s): listening on IPv4 only", error)
                    continue
                raise
            port = port or multi.extra(SocketAttribute.local_port)
            listeners.extend(cast(SocketListener, one) for one in multi.listeners)
    except BaseException:
        for listener in listeners:
            await listener.aclose()
        raise
    return MultiListener(listeners)


def describe(listener: MultiListener[SocketStream]) -> str:
    """The bound addresses, "127.0.0.1:5672,[::1]:5672" (no spaces: the ready line's format)."""
    parts = []
    for one in listener.listeners:
        address = one.extra(SocketAttribute.local_address)
        if isinstance(address, tuple):
            host, port = address[0], address[1]
            parts.append(f"[{host}]:{port}" if ":" in host else f"{host}:{port}")
        else:
            parts.append(str(address))
    return ",".join(parts)
