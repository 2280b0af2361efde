"""The common-publish lane (gateway/sessions/publish_lane.py and its compiled twin) routes
what route_publish would, the way publish_batch books it, and leaves the rest to it.

Random batches mix the common case with everything that must leave the lane: unknown or
closing channels, tx mode, other exchanges, immediate, headers, user-id, reply-to,
expiration, content-type and -encoding before delivery-mode (some cut short), delivery
modes 0 to 3, direct reply-to keys, unknown queues, queues of several partitions or that
may refuse a publish, and plain queues without confirms (which route_publish may hand to a
consumer at once). Each batch goes through the lane, with the general path taking every
publish the lane stops at, and through the general path alone: the records, the woken
queues, the confirms, the queues' counts and the channels' confirm tags must be the same.
Both twins run each batch, and must also return the same indexes.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any, cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.amqp import AMQPError, Publish
from gateway.queues.runtime import QueueRuntime
from gateway.routing import Router
from gateway.sessions import publish_lane
from gateway.sessions.channel_state import ChannelState
from gateway.sessions.publishing import route_publish
from meta.models import ExchangeDef, QueueDef
from storage import Record
from tests.harness.twins import built_twin

LANES = [
    pytest.param(publish_lane, id="pure"),
    pytest.param(built_twin(publish_lane), id="compiled"),
]
NOW_MS = 1_700_000_000_000

QUEUES = {  # name -> (partitions, plain, rejects_publish)
    "plain": (1, True, False),  # a transient publish without a confirm may go at once
    "durable": (1, False, False),  # not plain: stored whatever its consumers
    "refusing": (1, False, True),
    "spread": (3, False, False),
    # Not a name a client can declare: here it tells a lane that checks for direct reply-to
    # keys from one that finds this queue.
    "amq.rabbitmq.reply-to.abc": (1, False, False),
    # Runtimes of a subclass (OwnPartitions): the compiled lane reads their fields by name.
    "own": (1, True, False),
    "own-spread": (2, False, False),
}
KEYS = [*QUEUES, "nowhere"]


class OwnPartitions(QueueRuntime):
    """A runtime whose ``partitions`` is a property of its own, as a subclass may answer: a
    lane that read QueueRuntime's slot instead would find it unset."""

    @property  # type: ignore[override]
    def partitions(self) -> int:
        return int(self.__dict__["own_partitions"])

    @partitions.setter
    def partitions(self, value: int) -> None:
        self.__dict__["own_partitions"] = value


def _properties(draw: st.DrawFn) -> bytes:
    flags = 0
    body = b""
    if draw(st.booleans()):
        flags |= 0x8000
        body += bytes([n := draw(st.integers(0, 5))]) + b"t" * n
    if draw(st.booleans()):
        flags |= 0x4000
        body += bytes([n := draw(st.integers(0, 3))]) + b"e" * n
    if draw(st.integers(0, 9)) == 0:
        flags |= draw(st.sampled_from([0x2000, 0x0200, 0x0100, 0x0010]))
    if draw(st.integers(0, 4)):
        flags |= 0x1000
        body += bytes([draw(st.sampled_from([2, 2, 1, 0, 3]))])
    raw = struct.pack(">H", flags) + body
    if draw(st.integers(0, 12)) == 0:
        raw = raw[: draw(st.integers(0, len(raw)))]  # cut short
    return raw


@st.composite
def publishes(draw: st.DrawFn) -> Publish:
    return Publish(
        draw(st.sampled_from([1, 1, 1, 2, 3, 4, 9])),
        draw(st.sampled_from(["", "", "", "", "amq.direct"])),
        draw(st.sampled_from(KEYS)),
        draw(st.booleans()),
        draw(st.integers(0, 20)) == 0,
        _properties(draw),
        b"b" * draw(st.integers(0, 40)),
    )


class World:
    """A vhost's queues and one session's channels, as routing sees them."""

    def __init__(self, channel_modes: list[str]) -> None:
        router = Router("/")
        router.add_exchange(ExchangeDef(vhost="/", name="", type="direct"))
        router.add_exchange(ExchangeDef(vhost="/", name="amq.direct", type="direct"))
        self.queues: dict[str, QueueRuntime] = {}
        for number, (name, (partitions, plain, refusing)) in enumerate(QUEUES.items()):
            definition = QueueDef(vhost="/", name=name, queue_id=number + 1, partitions=partitions)
            runtime = OwnPartitions if name.startswith("own") else QueueRuntime
            queue = runtime(definition, cast(Any, None))
            queue.plain, queue.rejects_publish = plain, refusing
            queue.pick_partition = lambda gray=False: 1  # type: ignore[method-assign]
            queue.deliver_now = self._deliver_now  # type: ignore[method-assign]
            self.queues[name] = queue
        vhost = SimpleNamespace(name="/", queues=self.queues, router=router)
        self.session = SimpleNamespace(
            vhost=vhost,
            grants=SimpleNamespace(write={"": True, "amq.direct": True}),
            user="guest",
            impersonator=False,
            tap=None,
            node=SimpleNamespace(
                direct_replies=SimpleNamespace(lookup=lambda key: None, relay=None)
            ),
        )
        self.channels: dict[int, ChannelState] = {}
        for number, mode in enumerate(channel_modes, start=1):
            channel = ChannelState(number, cast(Any, self.session))
            channel.confirm_mode = mode in ("confirm", "closing")
            channel.tx_mode = mode == "tx"
            channel.closing = mode == "closing"
            channel.next_publish_tag = 10 * number
            self.channels[number] = channel
        self.handed: list[tuple[str, bytes]] = []  # deliver_now's deliveries
        self.records: list[Record] = []
        self.woken: set[QueueRuntime] = set()
        self.confirms: list[Any] = []
        self.confirm_records: list[int] = []

    def _deliver_now(self, exchange: str, key: str, properties: bytes, body: bytes, _: int) -> bool:
        """A consumer takes it at once when its body's length is even (as a no-ack consumer
        with credit would, or not)."""
        if len(body) % 2:
            return False
        self.handed.append((key, body))
        return True

    def general(self, publish: Publish) -> None:
        """publish_batch's loop for one publish (route_publish), outside tx mode."""
        channel = self.channels.get(publish.channel)
        if channel is None or channel.closing or channel.tx_mode:
            return
        try:
            record, queues, _, rejected, held = route_publish(
                cast(Any, self.session), channel, publish, NOW_MS
            )
        except AMQPError as error:  # what it raised is compared too
            self.records.append(cast(Any, ("raised", type(error).__name__)))
            return
        if record is not None:
            self.records.append(record)
            self.woken.update(queues)
        self.records.extend(held)
        if channel.confirm_mode:
            self.confirms.append((channel, channel.next_publish_tag, not rejected))
            self.confirm_records.append(len(self.records) - 1 if record is not None else -1)
            channel.next_publish_tag += 1

    def lane(self, route_run: Callable[..., int], batch: list[Publish]) -> list[int]:
        """The batch as publish_batch takes it: the lane, the general path where it stops."""
        stops, index = [], 0
        while index < len(batch):
            index = route_run(
                batch, index, self.channels, self.queues, NOW_MS, self.records, self.woken,
                self.confirms, self.confirm_records,
            )  # fmt: skip
            if index < len(batch):
                stops.append(index)
                self.general(batch[index])
                index += 1
        return stops

    def seen(self) -> tuple[Any, ...]:
        confirms = [(channel.number, tag, ok) for channel, tag, ok in self.confirms]
        counts = {n: (q.ready_count, q.ready_bytes, q.enqueued) for n, q in self.queues.items()}
        tags = {n: c.next_publish_tag for n, c in self.channels.items()}
        woken = sorted(q.name for q in self.woken)
        return self.records, woken, confirms, self.confirm_records, counts, tags, self.handed


modes = st.lists(st.sampled_from(["confirm", "confirm", "plain", "tx", "closing"]), max_size=4)


@settings(max_examples=300, deadline=None)
@given(modes, st.lists(publishes(), max_size=30))
def test_the_lane_routes_what_route_publish_does(
    channel_modes: list[str], batch: list[Any]
) -> None:
    alone = World(channel_modes)
    for publish in batch:
        alone.general(publish)
    results = []
    for lane in (publish_lane, built_twin(publish_lane)):
        world = World(channel_modes)
        stops = world.lane(lane.route_run, batch)
        assert world.seen() == alone.seen()
        results.append(stops)
    assert results[0] == results[1]  # and the twins leave the same publishes to it


@pytest.mark.parametrize("lane", LANES)
def test_common_publishes_all_take_the_lane(lane: Any) -> None:
    """Persistent publishes with a content-type, confirmed, to a queue: none leaves it."""
    world = World(["confirm"])
    properties = struct.pack(">H", 0x9000) + b"\x10application/json\x02"
    batch = [Publish(1, "", "durable", False, False, properties, b"x" * n) for n in range(50)]
    assert world.lane(lane.route_run, batch) == []
    queue = world.queues["durable"]
    assert (queue.ready_count, queue.ready_bytes, queue.enqueued) == (50, sum(range(50)), 50)
    assert [r.flags for r in world.records] == [1] * 50  # persistent
    assert [tag for _, tag, _ in world.confirms] == list(range(10, 60))
    assert world.confirm_records == list(range(50))
