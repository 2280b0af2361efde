"""Exclusivity holds across the gateways of a cluster as within one RabbitMQ cluster: an
exclusive consumer on one gateway refuses consumers on the others (and an exclusive consume
is refused while another gateway has any consumer), 403 ACCESS_REFUSED; an exclusive queue
is locked to its connection on every gateway, 405 RESOURCE_LOCKED. Both are released when
the owner's connection ends (within a second) or its gateway dies (within its lease)."""

from __future__ import annotations

import time
from collections.abc import Callable

import pika
import pika.exceptions
import pytest

from bench.servers import GatewayServer, check_for
from tests.cluster.conftest import Cluster

Channel = pika.adapters.blocking_connection.BlockingChannel
IN_USE = "ACCESS_REFUSED - queue 'q' in vhost '/' in exclusive use"
LOCKED = (
    "RESOURCE_LOCKED - cannot obtain exclusive access to locked queue 'q' in vhost '/'. It "
    "could be originally declared on another connection or the exclusive property value "
    "does not match that of the original declaration."
)


def connect(gateway: GatewayServer) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.URLParameters(gateway.url))


def refused(conn: pika.BlockingConnection, act: Callable[[Channel], object]) -> tuple[int, str]:
    """The channel error ``act`` gets on a new channel of ``conn``."""
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        act(conn.channel())
    return closed.value.reply_code, closed.value.reply_text


def consume(exclusive: bool = False) -> Callable[[Channel], object]:
    return lambda ch: ch.basic_consume("q", lambda *_: None, exclusive=exclusive)


def released_after(conn: pika.BlockingConnection, act: Callable[[Channel], object]) -> float:
    """Seconds until ``act`` succeeds on a new channel of ``conn`` (each refusal closes one)."""
    started = time.monotonic()

    def attempt() -> bool:
        try:
            act(conn.channel())
            return True
        except pika.exceptions.ChannelClosedByBroker:
            return False

    check_for(15, attempt, interval_s=0.01)
    return time.monotonic() - started


def _locked_there(conn: pika.BlockingConnection) -> bool:
    try:
        conn.channel().queue_declare("q", passive=True)
    except pika.exceptions.ChannelClosedByBroker as closed:
        return closed.reply_code == 405
    return False


def test_an_exclusive_consumer_on_one_gateway_refuses_consumers_on_another(
    cluster: Cluster,
) -> None:
    a, b = cluster.add_gateway("gwA"), cluster.add_gateway("gwB")
    owner = connect(a)
    owner.channel().queue_declare("q")
    owner.channel().basic_consume("q", lambda *_: None, exclusive=True)
    other = connect(b)
    check_for(5, lambda: other.channel().queue_declare("q", passive=True))
    assert refused(other, consume()) == (403, IN_USE)
    assert refused(other, consume(exclusive=True)) == (403, IN_USE)
    owner.close()  # the exclusive consumer goes with its connection
    took = released_after(other, consume())
    print(f"exclusive consumer released {took * 1000:.0f} ms after its connection closed")
    assert took < 1.0
    # Now B has a consumer: an exclusive consume on A is refused, a shared one is not.
    again = connect(a)
    assert refused(again, consume(exclusive=True)) == (403, IN_USE)
    again.channel().basic_consume("q", lambda *_: None)
    other.close()
    assert refused(again, consume(exclusive=True)) == (403, IN_USE)  # A's own consumer
    again.close()
    last = connect(b)
    took = released_after(last, consume(exclusive=True))
    print(f"queue free for an exclusive consumer {took * 1000:.0f} ms after the last closed")
    assert took < 1.0
    last.close()


def test_a_killed_gateways_exclusive_consumer_is_released_within_its_lease(
    cluster: Cluster,
) -> None:
    a, b = cluster.add_gateway("gwA"), cluster.add_gateway("gwB")
    owner = connect(a)
    owner.channel().queue_declare("q")
    owner.channel().basic_consume("q", lambda *_: None, exclusive=True)
    other = connect(b)
    check_for(5, lambda: other.channel().queue_declare("q", passive=True))
    assert refused(other, consume()) == (403, IN_USE)
    a.kill()
    killed = time.monotonic()
    released_after(other, consume(exclusive=True))
    took = time.monotonic() - killed
    print(f"killed gateway's exclusive consumer released after {took:.2f} s")
    assert took < 5.0  # the gateway lease
    other.close()


def test_an_exclusive_queue_is_locked_on_every_gateway_until_its_owner_goes(
    cluster: Cluster,
) -> None:
    a, b = cluster.add_gateway("gwA"), cluster.add_gateway("gwB")
    owner = connect(a)
    owner.channel().queue_declare("q", exclusive=True)
    other = connect(b)
    check_for(5, lambda: _locked_there(other))  # B heard of it (else: 404)
    for act in (
        lambda ch: ch.queue_declare("q", exclusive=True),
        lambda ch: ch.queue_declare("q"),
        lambda ch: ch.queue_declare("q", passive=True),
        consume(),
        lambda ch: ch.basic_get("q"),
        lambda ch: ch.queue_purge("q"),
        lambda ch: ch.queue_delete("q"),
    ):
        assert refused(other, act) == (405, LOCKED)
    owner.close()  # an exclusive queue is deleted with its connection
    took = released_after(other, lambda ch: ch.queue_declare("q", exclusive=True))
    print(f"exclusive queue free on the other gateway {took * 1000:.0f} ms after its close")
    assert took < 1.0
    # Now B owns it; B is killed: A's reaper deletes it once B's lease lapsed.
    taker = connect(a)
    assert refused(taker, consume()) == (405, LOCKED)
    b.kill()
    killed = time.monotonic()
    released_after(taker, lambda ch: ch.queue_declare("q", exclusive=True))
    took = time.monotonic() - killed
    print(f"killed gateway's exclusive queue free after {took:.2f} s")
    assert took < 7.5  # its gateway lease (5 s) and the reaper's round (1 s)
    taker.close()
