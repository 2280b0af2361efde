"""Timestamps are the 64-bit integers AMQP says they are, end to end (RabbitMQ 3.10 stores and
delivers any of them): pika publishing values a Python datetime cannot hold, with headers
(decoded on the way in) and through rewrites (BCC, direct reply-to), gets each back exactly;
the management API shows the integer; the Go client (amqp091-go) publishing random
properties with times before 1970 and beyond year 9999, in the property and in headers, gets
every message back as sent."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pytest

from bench.servers import free_port
from tests.compat.client_programs import build, run_client
from tests.harness.processes import GatewayProcess

STAMPS = (2**64 - 5, 2**63, 2**32, 253_402_300_800, 1_700_000_000, 0)
GO_DIR = Path(__file__).parent / "go" / "props"
GOPATH = Path("/usr/share/gocode")


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[GatewayProcess]:
    process = GatewayProcess(tmp_path / "data", ["--admin-port", str(free_port())]).start()
    yield process
    process.stop()


def test_pika_gets_every_64_bit_timestamp_back(gateway: GatewayProcess) -> None:
    with pika.BlockingConnection(pika.URLParameters(gateway.url)) as conn:
        ch = conn.channel()
        ch.queue_declare("ts", durable=True)
        ch.queue_declare("ts.bcc", durable=True)
        ch.confirm_delivery()
        sent: list[tuple[bytes, int]] = []
        for n, stamp in enumerate(STAMPS):
            for kind, headers in (("plain", None), ("headers", {"a": 1}),
                                  ("bcc", {"BCC": ["ts.bcc"]})):  # fmt: skip
                body = f"{kind}:{n}".encode()
                props = pika.BasicProperties(timestamp=stamp, headers=headers, delivery_mode=2)
                ch.basic_publish("", "ts", body, props)
                sent.append((body, stamp))
        got = []
        for _ in sent:
            _method, props, body = ch.basic_get("ts", auto_ack=True)
            got.append((body, props.timestamp))
        assert got == sent
        bcc = []
        while True:
            method, props, body = ch.basic_get("ts.bcc", auto_ack=True)
            if method is None:
                break
            bcc.append((body, props.timestamp))
        assert bcc == [(f"bcc:{n}".encode(), s) for n, s in enumerate(STAMPS)]
        ch.basic_publish("", "ts", b"shown", pika.BasicProperties(timestamp=2**64 - 1))
    status, messages = gateway.admin(
        "POST", "/api/queues/%2F/ts/get",
        {"count": 1, "ackmode": "ack_requeue_false", "encoding": "auto"},
    )  # fmt: skip
    assert status == 200, messages
    assert messages[0]["payload"] == "shown"
    assert messages[0]["properties"]["timestamp"] == 2**64 - 1


def test_a_direct_reply_keeps_its_timestamp(gateway: GatewayProcess) -> None:
    with pika.BlockingConnection(pika.URLParameters(gateway.url)) as conn:
        requester = conn.channel()
        replies: list[Any] = []
        requester.basic_consume("amq.rabbitmq.reply-to",
                                lambda _c, _m, props, _b: replies.append(props),
                                auto_ack=True)  # fmt: skip
        requester.queue_declare("rpc", durable=False)
        props = pika.BasicProperties(reply_to="amq.rabbitmq.reply-to", timestamp=2**63 + 7)
        requester.basic_publish("", "rpc", b"req", props)
        _method, got, _body = requester.basic_get("rpc", auto_ack=True)
        assert got.timestamp == 2**63 + 7  # the reply-to rewrite kept it
        requester.basic_publish("", got.reply_to, b"rep",
                                pika.BasicProperties(timestamp=2**64 - 2))  # fmt: skip
        conn.process_data_events(time_limit=2)
    assert [p.timestamp for p in replies] == [2**64 - 2]


def test_go_client_random_properties_come_back_as_sent(
    gateway: GatewayProcess, tmp_path: Path
) -> None:
    env = {**os.environ, "GO111MODULE": "off", "GOPATH": str(GOPATH),
           "GOCACHE": str(tmp_path / "cache")}  # fmt: skip
    build(["go", "build", "-o", str(tmp_path / "props"), "props.go"],
          needs=[GOPATH / "src/github.com/rabbitmq/amqp091-go"], cwd=GO_DIR, env=env,
          timeout_s=300)  # fmt: skip
    outcome = run_client([str(tmp_path / "props"), gateway.url, "300", "7"])
    assert outcome["problems"] == []
    assert (outcome["confirmed"], outcome["received"]) == (300, 300)
