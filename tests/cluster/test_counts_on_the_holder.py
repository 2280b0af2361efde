"""Counts on the gateway that delivers a queue, when the messages came through another one:
that gateway never counted them in at routing, so its own figure must not be what it answers
(a negative count broke queue.delete-ok with 541 before)."""

from __future__ import annotations

from bench.servers import check_for
from tests.cluster.conftest import Cluster
from tests.cluster.test_two_gateways import channel


def test_the_holder_counts_what_other_gateways_published(cluster: Cluster) -> None:
    a, b = cluster.add_gateway("gwA"), cluster.add_gateway("gwB")
    conn_a, ch_a = channel(a)
    ch_a.queue_declare("tally", durable=True)
    ch_a.basic_qos(prefetch_count=5)
    got: list[bytes] = []
    ch_a.basic_consume("tally", lambda ch, m, _p, body: got.append(body))
    check_for(10, lambda: "delivering queue 'tally'" in a.log(), interval_s=0.05)
    conn_b, ch_b = channel(b)
    ch_b.confirm_delivery()
    check_for(5, lambda: ch_b.queue_declare("tally", passive=True))
    for n in range(30):
        ch_b.basic_publish("", "tally", b"%d" % n)

    def five_held() -> bool:
        conn_a.process_data_events(time_limit=0.05)
        return len(got) == 5

    check_for(10, five_held, interval_s=0)
    # Five delivered and unacked: the holder says 25 ready, as RabbitMQ would, and so does
    # the other gateway once the holder's progress report (sent with its next offset commit,
    # within a second) is at the broker: unacked messages are not ready anywhere.
    check_for(5, lambda: ch_a.queue_declare("tally", passive=True).method.message_count == 25)
    check_for(5, lambda: ch_b.queue_declare("tally", passive=True).method.message_count == 25)
    ch_a.close()  # the five come back
    ch2 = conn_a.channel()
    check_for(5, lambda: ch2.queue_declare("tally", passive=True).method.message_count == 30)
    assert ch2.queue_delete("tally").method.message_count == 30
    conn_a.close()
    conn_b.close()


def test_drop_head_holds_on_the_holder_with_publishes_from_another_gateway(
    cluster: Cluster,
) -> None:
    a, b = cluster.add_gateway("gwA"), cluster.add_gateway("gwB")
    conn_a, ch_a = channel(a)
    ch_a.queue_declare("capped", durable=True, arguments={"x-max-length": 10})
    ch_a.basic_qos(prefetch_count=1)
    got: list[bytes] = []
    ch_a.basic_consume("capped", lambda ch, m, _p, body: got.append(body))  # never acks
    check_for(10, lambda: "delivering queue 'capped'" in a.log(), interval_s=0.05)
    conn_b, ch_b = channel(b)
    ch_b.confirm_delivery()
    check_for(5, lambda: ch_b.queue_declare("capped", passive=True))
    for n in range(50):
        ch_b.basic_publish("", "capped", b"%d" % n)

    def trimmed() -> bool:
        conn_a.process_data_events(time_limit=0.05)
        return ch_a.queue_declare("capped", passive=True).method.message_count == 10

    # The holder drops from the head down to ten ready (one more is unacked with A).
    check_for(10, trimmed, interval_s=0)
    # Got on A while its consumer still holds the first message (and A the lease). Closing
    # that channel first let A give the lease up now and then before the gets (a CI run):
    # the drops behind the unacked head cannot be committed (the committed offset is the
    # lowest unsettled one), so the next holder read them again. That hand-over case is
    # its own, open problem (noted in the performance issue's stop of 2026-11-29).
    ch2 = conn_a.channel()
    bodies = []
    while (message := ch2.basic_get("capped", auto_ack=True))[0] is not None:
        bodies.append(message[2])
    assert bodies == [b"%d" % n for n in range(40, 50)]  # the newest ten, only they
    conn_a.close()
    conn_b.close()
