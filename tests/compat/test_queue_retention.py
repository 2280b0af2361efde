"""The explicit ways to drop unread data, and only those: x-max-age (RabbitMQ's stream
argument, here for any queue) and the disk-overflow drop-oldest policy. Other queues keep
their messages until consumed."""

from __future__ import annotations

from pathlib import Path

import pika
import pika.exceptions
import pytest

from bench.servers import free_port
from meta.queue_arguments import parse_max_age
from tests.harness.processes import GatewayProcess, check_for

SEGMENT = 1 << 20


@pytest.mark.parametrize(
    ("value", "ms"),
    [("7D", 7 * 86_400_000), ("12h", 43_200_000), ("30m", 1_800_000), ("45s", 45_000),
     ("1Y", 365 * 86_400_000), ("2M", 60 * 86_400_000), ("0s", None), ("7", None),
     ("h", None), ("7x", None), ("-1s", None), ("1.5h", None)],
)  # fmt: skip
def test_max_age_is_parsed_as_rabbitmq_parses_it(value: str, ms: int | None) -> None:
    assert parse_max_age(value) == ms


def _declare_error(url: str, arguments: dict[str, object]) -> str:
    with pika.BlockingConnection(pika.URLParameters(url)) as conn:
        ch = conn.channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
            ch.queue_declare("aged", arguments=arguments)
        assert closed.value.reply_code == 406
        return str(closed.value.reply_text)


def test_bad_values_are_refused_with_rabbitmq_terms(gateway: GatewayProcess) -> None:
    prefix = "PRECONDITION_FAILED - invalid arg '{}' for queue 'aged' in vhost '/': "
    assert _declare_error(gateway.url, {"x-max-age": "7X"}) == (
        prefix.format("x-max-age") + "invalid_max_age"
    )
    assert _declare_error(gateway.url, {"x-max-age": 7}) == (
        prefix.format("x-max-age") + "{unacceptable_type,signedint}"
    )
    assert _declare_error(gateway.url, {"x-disk-overflow": "drop-newest"}) == (
        prefix.format("x-disk-overflow") + "invalid_disk_overflow"
    )


def test_max_age_drops_old_unread_messages_and_counts_them(tmp_path: Path) -> None:
    gateway = GatewayProcess(tmp_path / "data", ["--admin-port", str(free_port())]).start()
    try:
        with pika.BlockingConnection(pika.URLParameters(gateway.url)) as conn:
            ch = conn.channel()
            ch.confirm_delivery()
            ch.queue_declare("aged", durable=True, arguments={"x-max-age": "2s"})
            ch.queue_declare("kept", durable=True)
            for i in range(10):
                ch.basic_publish("", "aged", b"old %d" % i)
                ch.basic_publish("", "kept", b"old %d" % i)

            def count(queue: str) -> int:
                return int(ch.queue_declare(queue, passive=True).method.message_count)

            check_for(10, lambda: count("aged") == 0)
            assert count("kept") == 10  # no age limit: kept until consumed
            ch.basic_publish("", "aged", b"new")
            _method, _props, body = ch.basic_get("aged", auto_ack=True)
            assert body == b"new"
        stats = gateway.admin("GET", "/api/queues/%2F/aged")[1]
        assert stats["mqgw"]["dropped_by_retention"] == 10
        assert stats["mqgw"]["max_age_ms"] == 2000
        assert stats["messages_unacknowledged"] == 0
        assert "10 unread message(s) dropped: older than x-max-age" in gateway.log()
    finally:
        gateway.stop()


def test_disk_overflow_drop_oldest_keeps_publishers_going_within_the_budget(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    env = {
        "MQGW_SEGMENT_SIZE_BYTES": str(SEGMENT),
        "MQGW_MAX_MESSAGE_SIZE_BYTES": str(SEGMENT // 2),  # a segment must hold the largest
        "MQGW_DISK_BUDGET_BYTES": str(4 * SEGMENT),
        "MQGW_RETENTION_CHECK_INTERVAL_MS": "200",
        "MQGW_OFFSET_PERSIST_INTERVAL_MS": "200",
    }
    gateway = GatewayProcess(data, ["--admin-port", str(free_port())], env=env).start()
    try:
        params = pika.URLParameters(gateway.url)
        params.blocked_connection_timeout = 60  # blocked for longer: the test fails
        with pika.BlockingConnection(params) as conn:
            ch = conn.channel()
            ch.confirm_delivery()
            ch.queue_declare("lossy", durable=True, arguments={"x-disk-overflow": "drop-oldest"})
            total = 12_000  # ~12 segments: three times the budget
            for i in range(total):
                ch.basic_publish("", "lossy", b"%06d" % i + b"." * 1000)
            left = ch.queue_declare("lossy", passive=True).method.message_count
            assert 0 < left < total
            # What is left is the newest, in order: the oldest went.
            _first, _props, body = ch.basic_get("lossy", auto_ack=True)
            assert int(body[:6]) == total - left
        commitlog = sum(p.stat().st_size for p in (data / "store" / "commitlog").iterdir())
        assert commitlog <= 5 * SEGMENT
        stats = gateway.admin("GET", "/api/queues/%2F/lossy")[1]["mqgw"]
        assert stats["dropped_by_retention"] == total - left
        assert "disk-overflow drop-oldest" in gateway.log()
    finally:
        gateway.stop()
