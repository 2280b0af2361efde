"""A broker group down for longer than a gateway waits for it (10 s): gateways keep serving
the other group's queues, a gateway starts all the same, the queues on the down group answer
RabbitMQ's 404 for a queue whose home node is down (the admin API a 503), publishes to them
are nacked, and once the group is back its queues deliver what they held. (A consumer on
such a queue used to end the gateway after 10 s, and a gateway would not start while a group
was down.)"""

from __future__ import annotations

import time

import pika
import pika.exceptions
import pytest

from bench.servers import check_for
from tests.cluster.conftest import TwoGroups, connect

PERSISTENT = pika.BasicProperties(delivery_mode=2)


def test_a_group_down_leaves_the_rest_of_the_cluster_serving(two_groups: TwoGroups) -> None:
    a, b = two_groups.gateways
    conn_a, ch_a = connect(a)
    ch_a.confirm_delivery()
    queues = [f"q{i}" for i in range(4)]
    for queue in queues:
        ch_a.queue_declare(queue, durable=True)
        ch_a.basic_publish("", queue, f"before {queue}".encode(), PERSISTENT)
    on = {g: [q for q in queues if two_groups.route(q) == [g]] for g in ("g1", "g2")}
    assert len(on["g1"]) == len(on["g2"]) == 2, on
    up_1, up_2 = on["g1"]
    down_1, down_2 = on["g2"]

    two_groups.brokers["g2"].kill()
    b.kill()
    got: list[bytes] = []
    ch_a.basic_consume(down_1, lambda _c, _m, _p, body: got.append(body), auto_ack=True)
    # Past the 10 s a gateway waits for a broker: the consumer's take-over failed meanwhile.
    b.start(timeout_s=60)
    conn_a.process_data_events(time_limit=1)
    assert a.proc is not None and a.proc.poll() is None, a.log()[-3000:]
    assert got == []

    conn_b, ch_b = connect(b)
    ch_b.confirm_delivery()
    for gateway_channel in (ch_a, ch_b):  # both serve the group that is up
        method, _, body = gateway_channel.basic_get(up_1, auto_ack=True)
        assert body == f"before {up_1}".encode(), method
        up_1 = up_2
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        ch_b.queue_declare(down_2, passive=True)
    assert closed.value.reply_code == 404
    assert closed.value.reply_text == (
        f"NOT_FOUND - home node of queue '{down_2}' in vhost '/' is down or inaccessible"
    )
    ch_b = conn_b.channel()
    ch_b.confirm_delivery()
    with pytest.raises(pika.exceptions.NackError):
        ch_b.basic_publish("", down_2, b"while down", PERSISTENT)
    ch_b.basic_publish("", up_2, b"still flows", PERSISTENT)  # confirmed (no NackError)
    status, body = b.admin("GET", f"/api/queues/%2F/{down_2}")
    assert (status, body["error"]) == (503, "service_unavailable"), body
    # (A get of gwA's message here once made gwB count -1 unacknowledged and 0 messages.)
    detail = b.admin("GET", f"/api/queues/%2F/{up_2}")[1]
    assert (detail["messages_unacknowledged"], detail["messages"]) == (0, 1), detail
    assert b.admin("GET", "/metrics")[0] == 200

    two_groups.brokers["g2"].start()  # same data, same port
    deadline = time.monotonic() + 30
    while not got and time.monotonic() < deadline:
        conn_a.process_data_events(time_limit=0.1)
    assert got == [f"before {down_1}".encode()]

    channels = [conn_b.channel()]

    def get_on_b() -> bytes | None:
        try:
            return channels[0].basic_get(down_2, auto_ack=True)[2]
        except pika.exceptions.ChannelClosedByBroker as error:  # not reconnected to g2 yet
            assert error.reply_code == 404
            channels[0] = conn_b.channel()
            return None

    assert check_for(30, get_on_b) == f"before {down_2}".encode()
    ch_b = conn_b.channel()
    ch_b.confirm_delivery()
    ch_b.basic_publish("", down_2, b"after", PERSISTENT)  # confirmed again
    assert check_for(10, get_on_b) == b"after"
    assert "broker group g2 is down at start" in b.log()
    conn_a.close()
    conn_b.close()
