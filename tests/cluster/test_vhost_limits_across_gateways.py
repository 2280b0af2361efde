"""Per-vhost limits over two gateways sharing one Redis: max-connections counts the
connections of both (a third is refused on either, with RabbitMQ's 530 text), max-queues
counts the vhost's queues whoever declared them (the fourth is refused with 406), and the
connections of a killed gateway stop counting once another gateway has reaped it."""

from __future__ import annotations

import itertools
import signal
from typing import Any

from pamqp import commands as c

from bench.servers import GatewayServer, check_for
from tests.cluster.conftest import Cluster
from tests.diff.raw import RawClient

VHOST = "lim"
REFUSED = (
    530,
    f"NOT_ALLOWED - access to vhost '{VHOST}' refused for user 'guest': "
    "connection limit (2) is reached",
)


def _admin(gateway: GatewayServer, method: str, path: str, body: object = None) -> Any:
    status, answer = gateway.admin(method, path, body)
    assert status in (200, 201, 204), (method, path, status, answer)
    return answer


def _open(gateway: GatewayServer) -> tuple[RawClient, tuple[int, str] | None]:
    """A connection to the vhost, and (code, text) of its refusal, or None if it opened."""
    client = RawClient(gateway.amqp_port, vhost=VHOST)
    reply = client.connect()
    if isinstance(reply, c.Connection.Close):
        client.close()
        return client, (reply.reply_code, reply.reply_text)
    return client, None


def _refused(gateway: GatewayServer) -> tuple[int, str] | None:
    """The refusal of a new connection; one that opened is closed again (None)."""
    client, refusal = _open(gateway)
    if refusal is None:
        client.close()
    return refusal


def _opened(gateway: GatewayServer) -> RawClient | None:
    client, refusal = _open(gateway)
    return client if refusal is None else None


def _declare(client: RawClient, queue: str) -> Any:
    """queue.declare on a channel of its own (a refusal closes it)."""
    channel = next(_channels)
    client.open_channel(channel)
    reply = client.rpc(channel, c.Queue.Declare(queue=queue))
    if isinstance(reply, c.Channel.Close):
        client.send(channel, c.Channel.CloseOk())
        return reply.reply_code, reply.reply_text
    return reply.queue


_channels = itertools.count(1)


def test_limits_count_over_both_gateways_and_forget_a_reaped_one(cluster: Cluster) -> None:
    a, b = cluster.add_gateway("gwA"), cluster.add_gateway("gwB")
    _admin(a, "PUT", f"/api/vhosts/{VHOST}", {})
    rights = {"configure": ".*", "write": ".*", "read": ".*"}
    _admin(a, "PUT", f"/api/permissions/{VHOST}/guest", rights)
    _admin(a, "PUT", f"/api/vhost-limits/{VHOST}/max-connections", {"value": 2})
    _admin(b, "PUT", f"/api/vhost-limits/{VHOST}/max-queues", {"value": 3})
    assert _admin(a, "GET", "/api/vhost-limits") == [
        {"vhost": VHOST, "value": {"max-connections": 2, "max-queues": 3}}
    ]
    on_a = check_for(5, lambda: _opened(a), what="a connection on gwA")
    on_b = check_for(5, lambda: _opened(b), what="a connection on gwB")
    try:
        # One connection on each: a third is refused on either gateway.
        assert check_for(5, lambda: _refused(b), what="gwB refuses") == REFUSED
        assert _refused(a) == REFUSED

        # Queues declared on both count together: the fourth is refused on either.
        declared = [_declare(on_a, "q1"), _declare(on_b, "q2"), _declare(on_a, "q3")]
        assert declared == ["q1", "q2", "q3"]
        for client in (on_b, on_a):
            assert _declare(client, "q4") == (
                406,
                f"PRECONDITION_FAILED - cannot declare queue 'q4': queue limit in vhost "
                f"'{VHOST}' (3) is reached",
            )
        assert _declare(on_b, "q1") == "q1"  # an existing queue is declared again

        # gwA dies with its connection open: still counted until gwB reaps it (lease 5 s).
        assert a.stop(signal.SIGKILL) == -signal.SIGKILL
        assert _refused(b) == REFUSED
        again = check_for(20, lambda: _opened(b), interval_s=0.2, what="gwA's conn forgotten")
        assert _refused(b) == REFUSED  # on_b and the new one: the limit again
        again.close()
    finally:
        for client in (on_a, on_b):
            client.close()
