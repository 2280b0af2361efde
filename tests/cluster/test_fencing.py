"""Fencing tokens on offset commits, with real processes: gateway A delivers a queue, is
paused (SIGSTOP) past its delivery lease, gateway B takes the queue over; when A wakes up,
its late offset commit is refused by the broker (StaleFence), A stops delivering, and nothing
is skipped or counted twice: every confirmed message reaches a consumer, the count stays 0."""

from __future__ import annotations

import signal

import pika

from bench.servers import check_for
from tests.cluster.conftest import Cluster
from tests.cluster.test_two_gateways import channel

TOTAL = 200


def test_a_replaced_holder_cannot_commit_over_the_new_one(cluster: Cluster) -> None:
    a, b = cluster.add_gateway("gwA"), cluster.add_gateway("gwB")
    conn_a, ch_a = channel(a)
    ch_a.queue_declare("fenced", durable=True)
    conn_p, ch_p = channel(b)
    ch_p.confirm_delivery()
    check_for(3, lambda: ch_p.queue_declare("fenced", passive=True))
    for i in range(TOTAL):
        ch_p.basic_publish("", "fenced", b"%d" % i, pika.BasicProperties(delivery_mode=2))
    conn_p.close()

    # A delivers: 30 acked (and committed), 20 more held unacked.
    ch_a.basic_qos(prefetch_count=20)
    held: list[tuple[int, bytes]] = []
    got_a: list[bytes] = []
    for method, _props, body in ch_a.consume("fenced", inactivity_timeout=10):
        assert method is not None, f"A delivered only {len(got_a) + len(held)}"
        if len(got_a) < 30:
            got_a.append(body)
            ch_a.basic_ack(method.delivery_tag)
        else:
            held.append((method.delivery_tag, body))
            if len(held) == 20:
                break
    # What B counts: neither the 30 acked nor the 20 A holds are ready.
    committed = lambda: ch_b_count() == TOTAL - 30 - 20  # noqa: E731
    conn_b, ch_b = channel(b)

    def ch_b_count() -> int:
        return int(ch_b.queue_declare("fenced", passive=True).method.message_count)

    check_for(5, committed)  # A's commit (30) and progress report (20 more out) are there

    # B wants the queue too; A holds it until A stops renewing.
    conn_c, ch_c = channel(b)
    ch_c.basic_qos(prefetch_count=500)
    got_b: list[tuple[bytes, bool]] = []

    def on_message(
        ch: pika.adapters.blocking_connection.BlockingChannel,
        method: pika.spec.Basic.Deliver,
        _props: pika.BasicProperties,
        body: bytes,
    ) -> None:
        got_b.append((body, bool(method.redelivered)))
        ch.basic_ack(method.delivery_tag)

    ch_c.basic_consume("fenced", on_message)
    conn_c.process_data_events(time_limit=0.5)
    a.proc.send_signal(signal.SIGSTOP)  # type: ignore[union-attr]
    try:
        check_for(15, lambda: "delivering queue 'fenced'" in b.log(), interval_s=0.1)

        def drained() -> bool:
            conn_c.process_data_events(time_limit=0.1)
            return len(got_b) >= TOTAL - 30

        check_for(15, drained, interval_s=0)
    finally:
        a.proc.send_signal(signal.SIGCONT)  # type: ignore[union-attr]
    # B went on from A's committed offset: A's unacked 20 come again, flagged redelivered.
    assert [body for body, _ in got_b] == [b"%d" % i for i in range(30, TOTAL)]
    assert all(redelivered for _, redelivered in got_b[:20])
    check_for(5, lambda: ch_b_count() == 0)  # B committed everything

    # A wakes up and its consumer acks what it held: A's commit (offset 50, old token)
    # would move the queue's position back under B. Either the broker refuses it, or A's
    # lease renewal found the lease gone first and A commits nothing of that partition.
    for tag, _body in held:
        ch_a.basic_ack(tag)
    check_for(
        10,
        lambda: "offset commit refused" in a.log() or "lost the delivery lease" in a.log(),
        interval_s=0.1,
    )
    # A counts from the broker, where B's commits arrive each second.
    check_for(3, lambda: ch_a.queue_declare("fenced", passive=True).method.message_count == 0)
    for _ in range(3):  # a few commit intervals: the count stays 0, on both gateways
        assert ch_b_count() == 0
        assert ch_a.queue_declare("fenced", passive=True).method.message_count == 0
        conn_b.sleep(1.0)
    delivered = set(got_a) | {body for body, _ in got_b} | {body for _, body in held}
    assert delivered == {b"%d" % i for i in range(TOTAL)}  # nothing skipped
    assert conn_a.is_open  # refused commits do not close anything
    for conn in (conn_a, conn_b, conn_c):
        conn.close()
