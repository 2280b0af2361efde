"""Queues and delivery, compared with RabbitMQ: counts, purge and delete, redelivery and
requeue order, prefetch, transactions, lifecycles, server-sent cancel."""

from __future__ import annotations

from typing import Any

import pika
import pytest
from pamqp import commands as c

from tests.diff.support import Server, channel_error, describe, drain_get, run_both
from tests.harness.processes import check_for

QUIET_S = 0.3  # how long "nothing more arrives" is watched for (conn.sleep pumps events)


def _publish(ch: Any, queue: str, count: int, start: int = 0) -> None:
    for i in range(start, start + count):
        ch.basic_publish("", queue, b"m%d" % i)


def _declare_counts(server: Server, p: str) -> Any:
    conn = server.pika()
    ch = conn.channel()
    ch.confirm_delivery()
    first = ch.queue_declare(f"{p}-q").method
    _publish(ch, f"{p}-q", 3)
    counts = [(first.message_count, first.consumer_count)]
    ok = ch.queue_declare(f"{p}-q").method
    counts.append((ok.message_count, ok.consumer_count))
    ch2 = conn.channel()
    ch2.basic_qos(prefetch_count=1)
    ch2.basic_consume(f"{p}-q", lambda *a: None)
    ch2.basic_consume(f"{p}-q", lambda *a: None)
    conn.sleep(QUIET_S)
    ok = ch.queue_declare(f"{p}-q", passive=True).method
    counts.append((ok.message_count, ok.consumer_count))  # unacked are not ready
    ch2.close()  # unacked return
    ok = ch.queue_declare(f"{p}-q", passive=True).method
    counts.append((ok.message_count, ok.consumer_count))
    conn.close()
    return counts


def _purge_and_delete_counts(server: Server, p: str) -> Any:
    conn = server.pika()
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare(f"{p}-q")
    _publish(ch, f"{p}-q", 5)
    method, _, _ = ch.basic_get(f"{p}-q")
    purged = ch.queue_purge(f"{p}-q").method.message_count
    ch.basic_reject(method.delivery_tag, requeue=True)
    # RabbitMQ applies the reject asynchronously: poll rather than read once.
    after = check_for(2, lambda: ch.queue_declare(f"{p}-q", passive=True).method.message_count)
    _publish(ch, f"{p}-q", 2)
    deleted = ch.queue_delete(f"{p}-q").method.message_count
    gone = channel_error(lambda: ch.queue_declare(f"{p}-q", passive=True))
    conn.close()
    return purged, after, deleted, gone


def _get_fields(server: Server, p: str) -> Any:
    conn = server.pika()
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare(f"{p}-q")
    empty = ch.basic_get(f"{p}-q")
    _publish(ch, f"{p}-q", 3)
    got = drain_get(ch, f"{p}-q", auto_ack=False)
    conn.close()
    return empty, got


def _requeue_order(server: Server, p: str) -> Any:
    """Requeued messages go back to their original place, not to the tail."""
    conn = server.pika()
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare(f"{p}-q")
    _publish(ch, f"{p}-q", 10)
    tags = [ch.basic_get(f"{p}-q")[0].delivery_tag for _ in range(6)]
    for index in (4, 1, 3):
        ch.basic_nack(tags[index], requeue=True)
    ch.basic_reject(tags[0], requeue=False)
    first = drain_get(ch, f"{p}-q", auto_ack=False)  # requeued ones lead, then m6..m9
    ch.basic_nack(0, multiple=True, requeue=True)  # everything outstanding back
    second = drain_get(ch, f"{p}-q")
    conn.close()
    return first, second


def _close_requeues(server: Server, p: str) -> Any:
    conn = server.pika()
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare(f"{p}-q")
    _publish(ch, f"{p}-q", 4)
    ch2 = conn.channel()
    got: list[Any] = []
    ch2.basic_consume(f"{p}-q", lambda _c, m, _p, b: got.append((b, m.redelivered)))
    conn.sleep(QUIET_S)
    ch2.close()
    ch.basic_get(f"{p}-q")  # m0, redelivered, unacked
    ch.basic_recover(requeue=True)
    after = drain_get(ch, f"{p}-q")
    conn.close()
    return got, after


def _prefetch(global_qos: bool, count: int) -> Any:
    def scenario(server: Server, p: str) -> Any:
        conn = server.pika()
        ch = conn.channel()
        ch.confirm_delivery()
        for queue in ("a", "b"):
            ch.queue_declare(f"{p}-{queue}")
            _publish(ch, f"{p}-{queue}", 10)
        consumer = conn.channel()
        consumer.basic_qos(prefetch_count=count, global_qos=global_qos)
        got: dict[str, list[Any]] = {"a": [], "b": []}
        for queue in ("a", "b"):
            consumer.basic_consume(
                f"{p}-{queue}", lambda _c, m, _p, b, q=queue: got[q].append((b, m.delivery_tag))
            )
        conn.sleep(QUIET_S)
        in_flight = [len(got["a"]) + len(got["b"])]
        last = max(t for g in got.values() for _, t in g)
        consumer.basic_ack(last, multiple=False)
        conn.sleep(QUIET_S)
        in_flight.append(len(got["a"]) + len(got["b"]))
        consumer.basic_ack(0, multiple=True)
        conn.sleep(QUIET_S)
        in_flight.append(len(got["a"]) + len(got["b"]))
        conn.close()
        return in_flight, sorted(got["a"])[:1]

    return scenario


def _qos_after_consume(server: Server, p: str) -> Any:
    """basic.qos(global=false) applies to consumers created after it."""
    conn = server.pika()
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare(f"{p}-q")
    _publish(ch, f"{p}-q", 10)
    consumer = conn.channel()
    got: list[bytes] = []
    consumer.basic_qos(prefetch_count=2)
    consumer.basic_consume(f"{p}-q", lambda _c, _m, _p, b: got.append(b))
    consumer.basic_qos(prefetch_count=5)
    conn.sleep(QUIET_S)
    conn.close()
    return len(got)


def _no_ack_consume(server: Server, p: str) -> Any:
    conn = server.pika()
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare(f"{p}-q")
    _publish(ch, f"{p}-q", 5)
    ch.basic_qos(prefetch_count=1)  # ignored for no-ack consumers
    got: list[Any] = []
    tag = ch.basic_consume(
        f"{p}-q", lambda _c, m, _p, b: got.append((b, m.delivery_tag)), auto_ack=True
    )
    conn.sleep(QUIET_S)
    ch.basic_cancel(tag)
    _publish(ch, f"{p}-q", 2, start=5)
    left = ch.queue_declare(f"{p}-q", passive=True).method
    conn.close()
    return got, (left.message_count, left.consumer_count)


def _tx(server: Server, p: str) -> Any:
    conn = server.pika()
    ch = conn.channel()
    ch.queue_declare(f"{p}-q")
    observer = conn.channel()

    def count() -> int:
        return int(observer.queue_declare(f"{p}-q", passive=True).method.message_count)

    ch.tx_select()
    _publish(ch, f"{p}-q", 2)
    seen = [count()]
    ch.tx_commit()
    seen.append(count())
    _publish(ch, f"{p}-q", 1, start=2)
    ch.tx_rollback()
    seen.append(count())
    tag = ch.basic_get(f"{p}-q")[0].delivery_tag
    ch.basic_ack(tag)
    ch.tx_rollback()  # the ack is discarded: the message stays unacked
    seen.append(count())
    ch.basic_ack(tag)
    ch.tx_commit()
    seen.append(count())
    ch.basic_nack(ch.basic_get(f"{p}-q")[0].delivery_tag, requeue=True)
    ch.tx_commit()
    seen.append(drain_get(observer, f"{p}-q"))
    conn.close()
    return seen


def _exclusive_lifecycle(server: Server, p: str) -> Any:
    owner = server.pika()
    ch = owner.channel()
    ch.queue_declare(f"{p}-q", exclusive=True)
    ch.queue_declare(f"{p}-named", exclusive=True, durable=True)  # exclusive: never durable
    other = server.pika()
    seen = [channel_error(lambda: other.channel().queue_declare(f"{p}-q", passive=True))]
    owner.close()
    probe = other.channel()
    seen.append(channel_error(lambda: probe.queue_declare(f"{p}-q", passive=True)))
    seen.append(channel_error(lambda: other.channel().queue_declare(f"{p}-named", passive=True)))
    other.close()
    return seen


def _auto_delete_lifecycle(server: Server, p: str) -> Any:
    conn = server.pika()
    ch = conn.channel()
    ch.queue_declare(f"{p}-never", auto_delete=True)  # never consumed: stays
    ch.queue_declare(f"{p}-q", auto_delete=True)
    first = ch.basic_consume(f"{p}-q", lambda *a: None)
    second = ch.basic_consume(f"{p}-q", lambda *a: None)
    ch.basic_cancel(first)
    seen = [ch.queue_declare(f"{p}-q", passive=True).method.consumer_count]
    ch.basic_cancel(second)
    seen.append(channel_error(lambda: ch.queue_declare(f"{p}-q", passive=True)))
    ch = conn.channel()
    seen.append(ch.queue_declare(f"{p}-never", passive=True).method.consumer_count)
    ch2 = conn.channel()
    ch2.basic_consume(f"{p}-never", lambda *a: None)
    ch2.close()  # closing the channel cancels its consumers: the queue goes
    seen.append(channel_error(lambda: ch.queue_declare(f"{p}-never", passive=True)))
    conn.close()
    return seen


def _server_named(server: Server, p: str) -> Any:
    conn = server.pika()
    ch = conn.channel()
    ok = ch.queue_declare("", exclusive=True).method
    ch.queue_bind(ok.queue, "amq.fanout")
    ch.confirm_delivery()
    ch.basic_publish("amq.fanout", "", b"x")
    ch.queue_bind("", "amq.direct", f"{p}-k")  # '' means the last declared queue
    ch.basic_publish("amq.direct", f"{p}-k", b"y")
    got = [(ok.queue.startswith("amq.gen-"), len(ok.queue))]
    got.append([m[0] for m in drain_get(ch, "")])
    ch.queue_unbind(ok.queue, "amq.fanout")
    conn.close()
    return got


def _server_cancel(server: Server, p: str) -> Any:
    """Deleting a queue cancels its consumers with a server-sent basic.cancel."""
    with server.raw() as client:
        client.open_channel(1)
        client.open_channel(2)
        client.rpc(1, c.Queue.Declare(queue=f"{p}-q"))
        client.rpc(2, c.Basic.Consume(queue=f"{p}-q", consumer_tag="ct"))
        client.publish(1, "", f"{p}-q", b"one")
        delivered = describe(client.next_item(2))
        deleted = describe(client.rpc(1, c.Queue.Delete(queue=f"{p}-q")))
        return delivered, deleted, [describe(i) for i in client.drain(2)]


def _consumer_cancel_and_leftovers(server: Server, p: str) -> Any:
    with server.raw() as client:
        client.open_channel(1)
        client.rpc(1, c.Queue.Declare(queue=f"{p}-q"))
        client.rpc(1, c.Basic.Qos(prefetch_count=2))
        ok = describe(client.rpc(1, c.Basic.Consume(queue=f"{p}-q")))
        for i in range(4):
            client.publish(1, "", f"{p}-q", b"%d" % i)
        got = [describe(i) for i in client.drain(1)]
        cancelled = describe(client.rpc(1, c.Basic.Cancel(consumer_tag=ok[1]["consumer_tag"])))
        cancel_unknown = describe(client.rpc(1, c.Basic.Cancel(consumer_tag="nope")))
        client.send(1, c.Basic.Ack(2, multiple=True))
        left = describe(client.rpc(1, c.Queue.Declare(queue=f"{p}-q", passive=True)))
        return ok, got, cancelled, cancel_unknown, left


SCENARIOS = {
    "declare-ok-counts": _declare_counts,
    "purge-and-delete-counts": _purge_and_delete_counts,
    "get-fields-and-empty": _get_fields,
    "requeue-order": _requeue_order,
    "close-and-recover-requeue": _close_requeues,
    "prefetch-per-consumer": _prefetch(False, 3),
    "prefetch-global": _prefetch(True, 3),
    "qos-after-consume": _qos_after_consume,
    "no-ack-consume": _no_ack_consume,
    "tx-commit-rollback": _tx,
    "exclusive-lifecycle": _exclusive_lifecycle,
    "auto-delete-lifecycle": _auto_delete_lifecycle,
    "server-named-queue-and-last-queue": _server_named,
    "server-cancel-on-queue-delete": _server_cancel,
    "consumer-cancel-leftovers": _consumer_cancel_and_leftovers,
}


@pytest.mark.parametrize("name", list(SCENARIOS), ids=str)
def test_delivery_matches_rabbitmq(servers: list[Server], names: str, name: str) -> None:
    rabbit, gateway = run_both(servers, SCENARIOS[name], names)
    assert gateway == rabbit


def test_pika_sees_the_same_properties(servers: list[Server], names: str) -> None:
    """Every basic property through pika, decoded on the way back."""

    def scenario(server: Server, p: str) -> Any:
        conn = server.pika()
        ch = conn.channel()
        ch.queue_declare(f"{p}-q")
        props = pika.BasicProperties(
            content_type="text/plain", content_encoding="gzip", headers={"h": "v", "n": 1},
            delivery_mode=2, priority=7, correlation_id="corr", reply_to="reply",
            expiration="60000", message_id="mid", timestamp=1700000000, type="kind",
            user_id="guest", app_id="app", cluster_id="cluster",
        )  # fmt: skip
        ch.confirm_delivery()
        ch.basic_publish("", f"{p}-q", b"body", props)
        _method, got, body = ch.basic_get(f"{p}-q", auto_ack=True)
        conn.close()
        return vars(got), body

    rabbit, gateway = run_both(servers, scenario, names)
    assert gateway == rabbit
