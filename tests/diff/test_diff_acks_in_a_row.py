"""Single acks sent in one write, compared with RabbitMQ: the gateway settles a run of them at
once (basic_methods.basic_acks), which must settle what one after the other would. An unknown
tag among them settles the acks before it, closes the channel with 406, and drops the acks
after it; what was not acked comes back redelivered, in order."""

from __future__ import annotations

from typing import Any

from pamqp import commands as c

from gateway.amqp import frame_writer
from tests.diff.raw import Message, RawClient, describe_close
from tests.diff.support import Server, run_both

MESSAGES = 6


def _consume_all(client: RawClient, queue: str) -> list[int]:
    """Publish MESSAGES messages, consume them unacked on channel 1: their delivery tags."""
    client.rpc(1, c.Queue.Declare(queue=queue))
    client.send(1, c.Confirm.Select())
    client.wait_method(1, c.Confirm.SelectOk)
    for n in range(MESSAGES):
        client.publish(1, "", queue, b"m%d" % n)
    while client.wait_method(1, c.Basic.Ack).delivery_tag < MESSAGES:
        pass  # the publisher confirms (several at once, or not): until the last one
    client.rpc(1, c.Basic.Consume(queue=queue, consumer_tag="t"))
    tags = []
    while len(tags) < MESSAGES:
        item = client.next_item(1)
        assert isinstance(item, Message), item
        tags.append(item.method.delivery_tag)
    return tags


def _acks(tags: list[int]) -> bytes:
    return b"".join(frame_writer.method(1, c.Basic.Ack(delivery_tag=t)) for t in tags)


def _left_in_the_queue(client: RawClient, queue: str) -> list[tuple[bytes, bool]]:
    client.open_channel(2)
    left = []
    while True:
        item = client.rpc(2, c.Basic.Get(queue=queue, no_ack=True))
        if not isinstance(item, Message):
            return left
        left.append((item.body, bool(item.method.redelivered)))


def _acks_with_an_unknown_tag(server: Server, p: str) -> Any:
    with server.raw() as client:
        client.open_channel(1)
        tags = _consume_all(client, f"{p}-q")
        # One write: 1 and 2 are settled, 99 is unknown, 3 comes after the error.
        client.sock.sendall(_acks([tags[0], tags[1], 99, tags[2]]))
        closed = describe_close(client.next_method(1))
        client.send(1, c.Channel.CloseOk())
        return closed, _left_in_the_queue(client, f"{p}-q")


def _acks_all_known(server: Server, p: str) -> Any:
    with server.raw() as client:
        client.open_channel(1)
        tags = _consume_all(client, f"{p}-q")
        client.sock.sendall(_acks([tags[3], tags[0], tags[4], tags[1]]))  # out of order too
        client.send(1, c.Basic.Cancel(consumer_tag="t"))
        client.wait_method(1, c.Basic.CancelOk)
        client.send(1, c.Channel.Close(reply_code=200, reply_text="bye"))
        client.wait_method(1, c.Channel.CloseOk)  # the unacked go back
        return _left_in_the_queue(client, f"{p}-q")


def test_an_unknown_tag_among_acks_in_a_row_is_handled_as_rabbitmq(
    servers: list[Server], names: str
) -> None:
    rabbit, gateway = run_both(servers, _acks_with_an_unknown_tag, names)
    assert gateway == rabbit
    closed, left = gateway
    assert closed[:3] == ("channel", 406, "PRECONDITION_FAILED - unknown delivery tag 99")
    assert left == [(b"m%d" % n, True) for n in range(2, MESSAGES)]


def test_acks_in_a_row_settle_each_of_them(servers: list[Server], names: str) -> None:
    rabbit, gateway = run_both(servers, _acks_all_known, names)
    assert gateway == rabbit
    assert gateway == [(b"m2", True), (b"m5", True)]
