"""rabbitmqadmin, as RabbitMQ 3.10.8's management plugin serves it, against RabbitMQ and the
gateway: the same scenario gives the same tables (rows sorted; ports and node names, which
differ by nature, replaced).

RabbitMQ's queue and connection counters reach its API with the next stats emission (every
5 s), so a listing that shows counts is polled on both servers until it shows the expected
state, with a deadline."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pika
import pytest

from bench.servers import check_for
from tests.admin.conftest import AdminTarget, run_admin

STATS_DEADLINE_S = 20


def table(output: str) -> tuple[str, list[str]]:
    """(header, sorted rows) with ports and node names normalised."""
    lines = [re.sub(r":\d+\b", ":PORT", line) for line in output.splitlines() if line]
    if not lines:
        return "", []
    return lines[0], sorted(lines[1:])


def both(script: Path, targets: list[AdminTarget], *args: str) -> list[tuple[str, list[str]]]:
    return [table(run_admin(script, t, *args)) for t in targets]


def settled(
    script: Path, target: AdminTarget, args: tuple[str, ...], ok: Callable[[list[str]], bool]
) -> tuple[str, list[str]]:
    """The listing once ``ok`` accepts its rows (RabbitMQ's stats lag behind)."""

    def probe() -> tuple[str, list[str]] | None:
        header, rows = table(run_admin(script, target, *args))
        return (header, rows) if ok(rows) else None

    return check_for(STATS_DEADLINE_S, probe, interval_s=0.5)


def test_declare_list_publish_get_delete_match_rabbitmq(
    rabbitmqadmin: Path, targets: list[AdminTarget]
) -> None:
    for target in targets:
        for args in (
            ("declare", "exchange", "name=adm.x", "type=direct"),
            ("declare", "exchange", "name=adm.fan", "type=fanout", "durable=false"),
            ("declare", "queue", "name=adm.q1", "durable=true"),
            ("declare", "queue", "name=adm.q2", 'arguments={"x-max-length": 10}'),
            ("declare", "binding", "source=adm.x", "destination=adm.q1", "routing_key=k1"),
            ("declare", "binding", "source=adm.fan", "destination=adm.q2"),
        ):
            assert "declared" in run_admin(rabbitmqadmin, target, *args)
    for listing in (("list", "exchanges"), ("list", "bindings"), ("list", "vhosts", "name")):
        expected, actual = both(rabbitmqadmin, targets, *listing)
        assert actual == expected, listing
    extra = both(rabbitmqadmin, targets, "list", "exchanges", "name", "type", "durable")
    assert extra[1] == extra[0]
    queues_args = ("list", "queues", "name", "durable", "auto_delete", "arguments.x-max-length")
    expected, actual = both(rabbitmqadmin, targets, *queues_args)
    assert actual == expected

    publishes = (
        ("publish", "exchange=adm.x", "routing_key=k1", "payload=one"),
        ("publish", "exchange=adm.x", "routing_key=k1", "payload=two",
         'properties={"delivery_mode": 2, "content_type": "text/plain"}'),
        ("publish", "exchange=adm.fan", "routing_key=any", "payload=fan"),
        ("publish", "routing_key=adm.q2", "payload=direct"),
        ("publish", "exchange=adm.x", "routing_key=nowhere", "payload=lost"),
    )  # fmt: skip
    said = [[run_admin(rabbitmqadmin, t, *p) for p in publishes] for t in targets]
    assert said[1] == said[0]
    assert said[0][-1].strip() == "Message published but NOT routed"

    counts = ("list", "queues", "name", "messages", "messages_ready")
    want = ["adm.q1\t2\t2", "adm.q2\t2\t2"]
    listed = [
        settled(rabbitmqadmin, t, counts, lambda rows: [r for r in rows if "adm." in r] == want)
        for t in targets
    ]
    assert listed[1] == listed[0]
    per_vhost = ("list", "vhosts", "name", "messages", "messages_ready")
    vhost_counts = [
        settled(rabbitmqadmin, t, per_vhost, lambda rows: rows == ["/\t4\t4"]) for t in targets
    ]
    assert vhost_counts[1] == vhost_counts[0]

    for get in (
        ("get", "queue=adm.q1", "count=5"),  # ack_requeue_true: both come back, redelivered
        ("get", "queue=adm.q1", "count=1", "ackmode=ack_requeue_false"),
        ("get", "queue=adm.q2", "count=1", "ackmode=reject_requeue_false"),
        ("get", "queue=adm.q1", "count=3", "encoding=base64"),
    ):
        expected, actual = both(rabbitmqadmin, targets, *get)
        assert actual == expected, get
        assert expected[1], get  # something was got

    for target in targets:
        for args in (
            ("purge", "queue", "name=adm.q1"),
            ("delete", "binding", "source=adm.x", "destination_type=queue",
             "destination=adm.q1", "properties_key=k1"),
            ("delete", "queue", "name=adm.q2"),
            ("delete", "exchange", "name=adm.fan"),
        ):  # fmt: skip
            run_admin(rabbitmqadmin, target, *args)
    counts_after = [
        settled(
            rabbitmqadmin,
            t,
            counts,
            lambda rows: [r for r in rows if "adm." in r] == ["adm.q1\t0\t0"],
        )
        for t in targets
    ]
    assert counts_after[1] == counts_after[0]
    for listing in (("list", "exchanges"), ("list", "bindings")):
        expected, actual = both(rabbitmqadmin, targets, *listing)
        assert actual == expected, listing
    for target in targets:
        run_admin(rabbitmqadmin, target, "delete", "queue", "name=adm.q1")
        run_admin(rabbitmqadmin, target, "delete", "exchange", "name=adm.x")


def test_connections_channels_nodes_overview_have_rabbitmqs_columns(
    rabbitmqadmin: Path, targets: list[AdminTarget]
) -> None:
    clients = []
    for target in targets:
        connection = pika.BlockingConnection(pika.URLParameters(target.amqp_url))
        connection.channel()
        clients.append(connection)
    try:
        one_conn = ("list", "connections")  # name user channels, once stats show the channel
        listed = [
            settled(rabbitmqadmin, t, one_conn, lambda rows: any(r.endswith("\t1") for r in rows))
            for t in targets
        ]
        assert listed[1] == listed[0]
        channels = [
            settled(rabbitmqadmin, t, ("list", "channels"), lambda rows: len(rows) >= 1)
            for t in targets
        ]
        assert channels[1] == channels[0]
    finally:
        for connection in clients:
            connection.close()
    nodes = both(rabbitmqadmin, targets, "list", "nodes", "type")
    assert nodes[1] == nodes[0] == ("type", ["disc"])
    names = both(rabbitmqadmin, targets, "list", "nodes")
    assert names[1][0] == names[0][0] == "name\ttype\tmem_used"
    overview = both(rabbitmqadmin, targets, "show", "overview")
    assert overview[1][0] == overview[0][0]
    version = both(rabbitmqadmin, targets, "show", "overview", "rabbitmq_version")
    assert version[1] == version[0]


@pytest.mark.parametrize(
    "args",
    [
        ("declare", "exchange", "name=adm.bad", "type=nope"),
        ("declare", "queue", "name=adm.q", "durable=maybe"),
    ],
)
def test_refusals_are_reported_like_rabbitmq(
    rabbitmqadmin: Path, targets: list[AdminTarget], args: tuple[str, ...]
) -> None:
    outcomes = []
    for target in targets:
        try:
            run_admin(rabbitmqadmin, target, *args)
            outcomes.append("accepted")
        except AssertionError:
            outcomes.append("refused")
    assert outcomes == ["refused", "refused"]
