"""A queue's counts on every gateway of a cluster: the gateway delivering the queue counts
from its own positions; any other gives the broker's ready count (as its queue.declare-ok
does, from the deliverer's progress reports) and, unacknowledged, what the deliverer holds out
(from the same reports): the same figures on both, as RabbitMQ shows on every node.
A gateway that only published used to show every message it routed as ready for good, and
one that stopped delivering (restarted, say) kept its last figure."""

from __future__ import annotations

import signal

import pika
import pika.exceptions

from bench.servers import GatewayServer
from tests.admin.test_counts_after_restart import PERSISTENT, Admin, wait_for_counts
from tests.cluster.conftest import Cluster
from tests.harness.waiting import check_for

QUEUE = "counted"


class Consumer:
    """A manual-ack consumer with prefetch 1 on one gateway; deliveries kept in order."""

    def __init__(self, gateway: GatewayServer) -> None:
        self.connection = pika.BlockingConnection(pika.URLParameters(gateway.url))
        self.channel = self.connection.channel()
        self.channel.basic_qos(prefetch_count=1)
        self.got: list[tuple[int, bytes]] = []
        self.channel.basic_consume(
            QUEUE, lambda _ch, method, _p, body: self.got.append((method.delivery_tag, body))
        )

    def until(self, count: int) -> list[tuple[int, bytes]]:
        def enough() -> bool:
            self.connection.process_data_events(time_limit=0.05)
            return len(self.got) >= count

        check_for(10, enough, interval_s=0)
        return self.got

    def ack(self, index: int) -> None:
        self.channel.basic_ack(self.got[index][0])

    def until_closed(self) -> None:
        """Read until the server's connection.close arrives, as a live client does (what a
        client that never answers holds stays out of the broker's count after the gateway
        is gone, as after a crash, until another gateway takes the queue over)."""

        def closed() -> bool:
            try:
                self.connection.process_data_events(time_limit=0.05)
            except pika.exceptions.AMQPConnectionError:
                return True
            return self.connection.is_closed

        check_for(10, closed, interval_s=0)


def admin(gateway: GatewayServer) -> Admin:
    return Admin(lambda: gateway.admin_port)


def hold_one_of_five(
    a: GatewayServer, b: GatewayServer
) -> tuple[Consumer, pika.BlockingConnection]:
    """5 published through ``b``, the consumer on ``a`` acks "0" and holds "1": both gateways
    then show 3 ready, 1 unacked, 4 messages."""
    consumer, publishing = publish_five_through_b(a, b)
    consumer.until(1)
    consumer.ack(0)
    assert [body for _, body in consumer.until(2)] == [b"0", b"1"]  # "1" stays unacked
    wait_for_counts(admin(a), QUEUE, (3, 1, 4))
    wait_for_counts(admin(b), QUEUE, (3, 1, 4))
    return consumer, publishing


def publish_five_through_b(
    a: GatewayServer, b: GatewayServer
) -> tuple[Consumer, pika.BlockingConnection]:
    """``a`` delivers the queue to a consumer; ``b`` publishes 5 persistent messages."""
    declaring = pika.BlockingConnection(pika.URLParameters(a.url))
    declaring.channel().queue_declare(QUEUE, durable=True)
    declaring.close()
    consumer = Consumer(a)
    check_for(10, lambda: f"delivering queue '{QUEUE}'" in a.log(), interval_s=0.05)
    publishing = pika.BlockingConnection(pika.URLParameters(b.url))
    channel = publishing.channel()
    channel.confirm_delivery()
    check_for(5, lambda: channel.queue_declare(QUEUE, passive=True))
    for n in range(5):
        channel.basic_publish("", QUEUE, b"%d" % n, PERSISTENT)
    return consumer, publishing


def test_counts_on_both_gateways_across_a_restart_of_the_delivering_one(
    cluster: Cluster,
) -> None:
    a, b = cluster.add_gateway("gwA"), cluster.add_gateway("gwB")
    consumer, publishing = hold_one_of_five(a, b)  # B's own routing count said 5 ready

    assert a.proc is not None
    a.proc.send_signal(signal.SIGTERM)
    consumer.until_closed()  # its channel goes with the connection: "1" is ready again
    assert a.proc.wait(20) == 0
    a.start()
    wait_for_counts(admin(a), QUEUE, (4, 0, 4))
    wait_for_counts(admin(b), QUEUE, (4, 0, 4))

    # B delivers now; A, restarted without consumers, reads the broker's count.
    taker = Consumer(b)
    for index in range(4):
        taker.until(index + 1)
        taker.ack(index)
    assert [body for _, body in taker.got] == [b"1", b"2", b"3", b"4"]
    wait_for_counts(admin(b), QUEUE, (0, 0, 0))
    wait_for_counts(admin(a), QUEUE, (0, 0, 0))  # its start-up count said 4 for good
    taker.connection.close()
    publishing.close()


def test_a_delivery_from_what_the_holder_has_in_hand_reaches_the_other_gateway(
    cluster: Cluster,
) -> None:
    a, b = cluster.add_gateway("gwA"), cluster.add_gateway("gwB")
    first, publishing = publish_five_through_b(a, b)
    first.until(1)
    wait_for_counts(admin(a), QUEUE, (4, 1, 5))
    wait_for_counts(admin(b), QUEUE, (4, 1, 5))
    # A second consumer takes "1" from what A read already: no cursor moves, no offset is
    # committed, yet B's count (the broker's, from A's progress reports) must follow.
    second = Consumer(a)
    assert [body for _, body in second.until(1)] == [b"1"]
    wait_for_counts(admin(a), QUEUE, (3, 2, 5))
    wait_for_counts(admin(b), QUEUE, (3, 2, 5))  # stayed (4, 1, 5)
    for consumer in (first, second):
        consumer.connection.close()
    publishing.close()


def test_the_other_gateway_shows_the_delivering_gateways_unacked(cluster: Cluster) -> None:
    """As RabbitMQ shows the same figures on every node: B, which does not deliver the
    queue, counts as unacknowledged what A's consumers hold (it said 0, and 3 messages)."""
    a, b = cluster.add_gateway("gwA"), cluster.add_gateway("gwB")
    first, publishing = publish_five_through_b(a, b)
    assert [body for _, body in first.until(1)] == [b"0"]
    second = Consumer(a)
    assert [body for _, body in second.until(1)] == [b"1"]
    wait_for_counts(admin(a), QUEUE, (3, 2, 5))
    wait_for_counts(admin(b), QUEUE, (3, 2, 5))  # was (3, 0, 3)
    first.ack(0)
    assert [body for _, body in first.until(2)] == [b"0", b"2"]
    wait_for_counts(admin(a), QUEUE, (2, 2, 4))
    wait_for_counts(admin(b), QUEUE, (2, 2, 4))
    for consumer in (first, second):
        consumer.connection.close()  # "1" and "2" go back
    wait_for_counts(admin(a), QUEUE, (4, 0, 4))
    wait_for_counts(admin(b), QUEUE, (4, 0, 4))
    publishing.close()
