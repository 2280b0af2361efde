"""Routing, compared with RabbitMQ: every exchange type, topic and headers edge cases,
exchange-to-exchange bindings, alternate exchanges, mandatory returns and confirms."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pika
import pytest
from pamqp import commands

from tests.diff.support import Server, drain_get, run_both

# (exchange type, [(binding key, binding arguments) per queue], [(routing key, headers)])
RoutingCase = tuple[str, list[tuple[str, dict[str, Any] | None]], list[tuple[str, Any]]]

TOPIC_KEYS = ["", ".", "a", "b", "a.", ".a", "a.b", "a..b", "a.b.b", "a.x.b", "a.x.y.b", "b.a",
              "abc", "a.b.c", "x.b.y", "#", "*", "a.*"]  # fmt: skip


def _topic(*keys: str) -> RoutingCase:
    return ("topic", [(k, None) for k in keys], [(rk, None) for rk in TOPIC_KEYS])


ROUTING_CASES: dict[str, RoutingCase] = {
    "direct": (
        "direct",
        [("a", None), ("A", None), ("", None), ("a", None)],
        [("a", None), ("A", None), ("", None), ("a.b", None), ("b", None)],
    ),
    "fanout": ("fanout", [("", None), ("ignored", None)], [("x", None), ("", None)]),
    "topic-hash-zero-words": _topic("#", "a.#", "#.a", "#.#"),
    "topic-hash-middle": _topic("a.#.b", "#.b.#", "a.#.#.b"),
    "topic-star": _topic("*", "*.*", "a.*", "*.a", "*.#", "#.*", "a.*.#"),
    "topic-literal": _topic("", "a..b", "a.b", "abc"),
}

HEADER_MESSAGES: list[tuple[str, Any]] = [
    ("", None),
    ("", {}),
    ("", {"a": 1}),
    ("", {"a": 1, "b": "two"}),
    ("", {"a": 1, "b": "two", "x-extra": "y"}),
    ("", {"a": "1"}),
    ("", {"a": True}),
    ("", {"a": 2, "b": "two", "c": None}),
    ("", {"b": "two", "x-extra": "y"}),
    ("", {"x-extra": "y"}),
    ("", {"a": Decimal("1.0")}),
    ("", {"a": [1], "n": {"k": 1}}),
]
ROUTING_CASES.update(
    {
        "headers-all": ("headers", [
            (None, {"x-match": "all", "a": 1, "b": "two"}),
            (None, {"a": 1}),  # x-match defaults to all
            (None, {"x-match": "all"}),  # nothing to match: everything matches
            (None, {"x-match": "all", "c": None}),  # void: presence only
            (None, {"x-match": "all", "a": True}),
        ], HEADER_MESSAGES),
        "headers-any": ("headers", [
            (None, {"x-match": "any", "a": 1, "b": "two"}),
            (None, {"x-match": "any"}),  # nothing to match: nothing matches
            (None, {"x-match": "any", "a": "1", "zz": 0}),
            (None, {"x-match": "any", "n": {"k": 1}, "a": [1]}),
        ], HEADER_MESSAGES),
        "headers-with-x": ("headers", [
            (None, {"x-match": "all-with-x", "x-extra": "y"}),
            (None, {"x-match": "any-with-x", "x-extra": "y", "a": 2}),
            (None, {"x-match": "all", "x-extra": "y"}),  # x- keys are ignored
            (None, {"x-match": "any", "x-extra": "y"}),
        ], HEADER_MESSAGES),
    }
)  # fmt: skip


def _routing(case: RoutingCase) -> Any:
    kind, bindings, messages = case

    def scenario(server: Server, p: str) -> Any:
        conn = server.pika()
        ch = conn.channel()
        ch.exchange_declare(f"{p}-x", kind)
        for index, (key, arguments) in enumerate(bindings):
            queue = f"{p}-q{index}"
            ch.queue_declare(queue)
            ch.queue_bind(queue, f"{p}-x", key or "", arguments=arguments)
        ch.confirm_delivery()
        for index, (key, headers) in enumerate(messages):
            props = pika.BasicProperties(headers=headers)
            ch.basic_publish(f"{p}-x", key, f"m{index}:{key}".encode(), props)
        got = {i: [m[0] for m in drain_get(ch, f"{p}-q{i}")] for i in range(len(bindings))}
        conn.close()
        return got

    return scenario


@pytest.mark.parametrize("case", list(ROUTING_CASES), ids=str)
def test_routing_matches_rabbitmq(servers: list[Server], names: str, case: str) -> None:
    rabbit, gateway = run_both(servers, _routing(ROUTING_CASES[case]), names)
    assert gateway == rabbit


# -- exchange-to-exchange, alternate exchanges, default exchange ------------------------


def _e2e(server: Server, p: str) -> Any:
    """A chain topic -> fanout -> direct, a cycle, and a queue reached twice gets one copy."""
    conn = server.pika()
    ch = conn.channel()
    ch.exchange_declare(f"{p}-top", "topic")
    ch.exchange_declare(f"{p}-fan", "fanout")
    ch.exchange_declare(f"{p}-dir", "direct")
    ch.exchange_bind(f"{p}-fan", f"{p}-top", "a.*")
    ch.exchange_bind(f"{p}-dir", f"{p}-fan")
    ch.exchange_bind(f"{p}-top", f"{p}-dir", "a.loop")  # cycle back to the top
    for queue, source, key in [("q1", "top", "#"), ("q2", "fan", ""), ("q3", "dir", "a.b"),
                               ("q1", "dir", "a.b")]:  # fmt: skip
        ch.queue_declare(f"{p}-{queue}")
        ch.queue_bind(f"{p}-{queue}", f"{p}-{source}", key)
    ch.confirm_delivery()
    for key in ["a.b", "a.c", "b", "a.loop"]:
        ch.basic_publish(f"{p}-top", key, key.encode())
    got = {q: [m[0] for m in drain_get(ch, f"{p}-{q}")] for q in ("q1", "q2", "q3")}
    ch.exchange_unbind(f"{p}-fan", f"{p}-top", "a.*")
    ch.basic_publish(f"{p}-top", "a.b", b"after-unbind")
    got["after"] = [m[0] for q in ("q1", "q2", "q3") for m in drain_get(ch, f"{p}-{q}")]
    conn.close()
    return got


def _alternate(server: Server, p: str) -> Any:
    """Unroutable messages go to the alternate exchange (chained); mandatory sees them routed."""
    conn = server.pika()
    ch = conn.channel()
    ch.exchange_declare(f"{p}-ae2", "fanout")
    ch.exchange_declare(f"{p}-ae", "direct", arguments={"alternate-exchange": f"{p}-ae2"})
    ch.exchange_declare(f"{p}-main", "direct", arguments={"alternate-exchange": f"{p}-ae"})
    ch.exchange_declare(f"{p}-dangling", "direct", arguments={"alternate-exchange": f"{p}-no"})
    for queue, source, key in [("q", "main", "k"), ("ae", "ae", "special"), ("ae2", "ae2", "")]:
        ch.queue_declare(f"{p}-{queue}")
        ch.queue_bind(f"{p}-{queue}", f"{p}-{source}", key)
    returned: list[Any] = []
    ch.add_on_return_callback(lambda _c, m, _p, b: returned.append((m.reply_code, m.reply_text, b)))
    ch.confirm_delivery()
    for key in ["k", "special", "other"]:
        ch.basic_publish(f"{p}-main", key, key.encode(), mandatory=True)
    for body in [b"d1", b"d2"]:
        try:
            ch.basic_publish(f"{p}-dangling", "x", body, mandatory=True)
        except pika.exceptions.UnroutableError:
            returned.append(("unroutable", body))
    got = {q: [m[0] for m in drain_get(ch, f"{p}-{q}")] for q in ("q", "ae", "ae2")}
    conn.close()
    return got, returned


def _default_exchange(server: Server, p: str) -> Any:
    """Confirm mode makes returns deterministic: a basic.return precedes its ack."""
    conn = server.pika()
    ch = conn.channel()
    ch.queue_declare(f"{p}-q")
    ch.confirm_delivery()
    returned: list[Any] = []
    publishes = [
        ("", f"{p}-q", b"direct", None),
        ("", f"{p}-nowhere", b"lost", {"h": 1}),
        ("amq.direct", f"{p}-q", b"unbound", None),
    ]
    for exchange, key, body, headers in publishes:
        try:
            ch.basic_publish(exchange, key, body, pika.BasicProperties(headers=headers),
                             mandatory=True)  # fmt: skip
        except pika.exceptions.UnroutableError as error:
            for m in error.messages:
                returned.append((m.method.reply_code, m.method.reply_text, m.method.exchange,
                                 m.method.routing_key, m.properties.headers, m.body))  # fmt: skip
    got = drain_get(ch, f"{p}-q")
    conn.close()
    return got, returned


def _confirms(server: Server, p: str) -> Any:
    """Confirms cover routed, unroutable and mandatory-returned publishes alike."""
    conn = server.pika()
    ch = conn.channel()
    ch.queue_declare(f"{p}-q")
    ch.confirm_delivery()
    outcomes = []
    for i in range(20):
        key = f"{p}-q" if i % 3 else f"{p}-none"
        try:
            ch.basic_publish("", key, b"%d" % i, mandatory=i % 2 == 0)
            outcomes.append("ack")
        except pika.exceptions.UnroutableError:
            outcomes.append("returned")
    count = ch.queue_declare(f"{p}-q", passive=True).method.message_count
    conn.close()
    return outcomes, count


def _raw_confirm_tags(server: Server, p: str) -> Any:
    """Delivery tags and `multiple` flags are batching-dependent; the acked set is not."""
    with server.raw() as client:
        client.open_channel(1)
        client.rpc(1, commands.Confirm.Select())
        client.rpc(1, commands.Queue.Declare(queue=f"{p}-q"))
        for i in range(50):
            client.publish(1, "", f"{p}-q" if i % 2 else f"{p}-none", b"x")
        acked: set[int] = set()
        while len(acked) < 50:
            ack = client.next_method(1)
            assert isinstance(ack, commands.Basic.Ack), ack
            low = 1 if ack.multiple else ack.delivery_tag  # multiple: every tag up to it
            acked.update(range(low, ack.delivery_tag + 1))
        return sorted(acked) == list(range(1, 51)), client.drain(1, 0.2)


SCENARIOS = {
    "exchange-to-exchange": _e2e,
    "alternate-exchange": _alternate,
    "default-exchange-and-mandatory-return": _default_exchange,
    "confirm-counts-with-returns": _confirms,
    "confirm-tags-cover-every-publish": _raw_confirm_tags,
}


@pytest.mark.parametrize("name", list(SCENARIOS), ids=str)
def test_scenario_matches_rabbitmq(servers: list[Server], names: str, name: str) -> None:
    rabbit, gateway = run_both(servers, SCENARIOS[name], names)
    assert gateway == rabbit
