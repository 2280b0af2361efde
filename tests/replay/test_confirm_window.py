"""The windowed sender against a real gateway: with hundreds of publishes in flight on one
channel, each message's outcome (confirmed, returned, nacked, error) lands on that message."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest

from bench.servers import GatewayServer, check_for
from replay.amqp_props import encode, stamp
from replay.confirm_window import Outgoing, WindowedSender


class ListFeed:
    """Messages all due now, taken in order; records the window's fill at each take."""

    def __init__(self, routes: list[tuple[str, str]]) -> None:
        self.routes = routes
        self.taken = 0
        self.in_flight_at_take: list[int] = []
        self.sender: WindowedSender | None = None
        self.stop = threading.Event()

    def next_due(self) -> float | None:
        return time.time() if self.taken < len(self.routes) else None

    def take(self) -> Outgoing:
        number = self.taken
        self.taken += 1
        assert self.sender is not None
        self.in_flight_at_take.append(len(self.sender.in_flight))
        exchange, key = self.routes[number]
        raw = stamp(encode(pika.BasicProperties(delivery_mode=2)), {"id": f"m{number}"})
        return Outgoing(exchange, key, raw, b"body %d" % number, f"m{number}", number)

    def stop_requested(self) -> bool:
        return self.stop.is_set()


def sender_for(url: str, feed: ListFeed, window: int) -> tuple[WindowedSender, dict[int, list]]:
    outcomes: dict[int, list[tuple[str, str | None]]] = {}
    sender = WindowedSender(
        url,
        feed,
        lambda token, outcome, reason: outcomes.setdefault(token, []).append((outcome, reason)),
        window=window,
    )
    feed.sender = sender
    return sender, outcomes


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[GatewayServer]:
    server = GatewayServer(tmp_path / "gw", flush="async").start()
    connection = pika.BlockingConnection(pika.URLParameters(server.url))
    channel = connection.channel()
    channel.confirm_delivery()
    channel.exchange_declare("x", "direct", durable=True)
    channel.queue_declare("ok", durable=True)
    channel.queue_declare(
        "full", durable=True, arguments={"x-max-length": 1, "x-overflow": "reject-publish"}
    )
    channel.queue_bind("ok", "x", "ok")
    channel.queue_bind("full", "x", "full")
    channel.basic_publish("x", "full", b"fills it")  # from now on "full" refuses: a nack
    connection.close()
    yield server
    server.stop()


def test_interleaved_confirms_returns_and_nacks_reach_their_own_messages(
    gateway: GatewayServer,
) -> None:
    kinds = {"ok": "confirmed", "nowhere": "returned", "full": "nacked"}
    pattern = ["ok", "nowhere", "ok", "full", "ok", "ok", "nowhere", "full", "full", "ok"]
    routes = [("x", pattern[(i * 7 + i // 10) % len(pattern)]) for i in range(600)]
    feed = ListFeed(routes)
    sender, outcomes = sender_for(gateway.url, feed, window=1000)
    sender.run()
    assert sender.failure is None and sender.unmatched_returns == 0
    assert sender.published == len(routes) and not sender.in_flight
    assert max(feed.in_flight_at_take) >= 100  # many publishes were unconfirmed at once
    assert sorted(outcomes) == list(range(len(routes)))  # each message settled exactly once
    for number, (_, key) in enumerate(routes):
        assert len(outcomes[number]) == 1, (number, outcomes[number])
        outcome, reason = outcomes[number][0]
        assert outcome == kinds[key], (number, key, outcome, reason)
        if outcome == "returned":
            assert reason == "312 NO_ROUTE"
    counts = {k: sum(o[0][0] == k for o in outcomes.values()) for k in kinds.values()}
    assert min(counts.values()) > 100


def test_a_closed_channel_fails_what_was_in_flight_and_the_rest_goes_on(
    gateway: GatewayServer,
) -> None:
    """A publish to a missing exchange closes the channel (404): what was unconfirmed then is
    an error, never sent again; later messages go out on a new channel."""
    routes = [("x", "ok")] * 300 + [("no-such-exchange", "ok")] + [("x", "ok")] * 5000
    feed = ListFeed(routes)
    sender, outcomes = sender_for(gateway.url, feed, window=1000)
    sender.run()
    assert sender.failure is None
    assert sorted(outcomes) == list(range(len(routes)))
    assert all(len(o) == 1 for o in outcomes.values())
    bad_outcome, bad_reason = outcomes[300][0]
    assert bad_outcome == "error" and bad_reason is not None
    assert "404" in bad_reason and bad_reason.startswith("channel closed before its confirm")
    errors = [n for n, o in outcomes.items() if o[0][0] == "error"]
    confirmed = [n for n, o in outcomes.items() if o[0][0] == "confirmed"]
    assert len(errors) + len(confirmed) == len(routes)
    assert max(confirmed) == len(routes) - 1  # sending went on after the close
    assert sender.published == len(routes)  # nothing was published twice


def test_a_lost_connection_makes_the_unconfirmed_errors_not_resends(
    gateway: GatewayServer,
) -> None:
    routes = [("x", "ok")] * 200_000
    feed = ListFeed(routes)
    sender, outcomes = sender_for(gateway.url, feed, window=1000)
    runner = threading.Thread(target=sender.run)
    runner.start()
    check_for(30, lambda: len(outcomes) > 5000 or None, 0.01)
    gateway.kill()
    runner.join(30)
    assert not runner.is_alive()
    assert sender.failure is not None and sender.failure.startswith("cannot connect")
    assert sender.published == feed.taken < len(routes)
    assert sorted(outcomes) == list(range(feed.taken))  # everything sent has one result
    assert all(len(o) == 1 for o in outcomes.values())
    errors = [o[0] for o in outcomes.values() if o[0][0] == "error"]
    assert errors and all(r and r.startswith("connection lost before") for _, r in errors)
