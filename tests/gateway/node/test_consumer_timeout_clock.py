"""The consumer timeout reads the node's clock, never ``time`` itself: a delivery is stamped
with the clock handed down, so a test moves time in milliseconds instead of sleeping."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import anyio

from gateway.amqp.errors import PreconditionFailed
from gateway.node.consumer_timeouts import fail_timed_out
from gateway.queues.runtime import QueueRuntime
from gateway.sessions.channel_state import ChannelState, Consumer
from meta.models import QueueDef
from storage import Record, open_embedded_store
from tests.gateway.queues.test_push_scheduler import _config
from tests.harness.clock import FakeClock


class _Session:
    """What the timeout check asks of a session: its channels, and how to fail one."""

    id = "test-session"

    def __init__(self) -> None:
        self.channels: dict[int, ChannelState] = {}
        self.failed: list[tuple[int, Exception]] = []

    async def fail(self, channel: ChannelState, error: Exception) -> None:
        self.failed.append((channel.number, error))
        channel.closing = True

    def mark_dirty(self) -> None:
        pass


def test_a_delivery_times_out_once_its_timeout_has_passed_on_the_node_clock(tmp_path: Path) -> None:
    async def scenario() -> list[tuple[int, Exception]]:
        clock = FakeClock()
        async with open_embedded_store(_config(tmp_path)) as store:
            await store.create_queue(1, 1)
            await store.append([Record(b"", b"q", b"", b"held", ((1, 0),))])
            queue = QueueRuntime(QueueDef(vhost="/", name="q", queue_id=1), store)
            message = (await store.read(1, 0, 0)).messages[0]
            session = _Session()
            channel = ChannelState(3, cast(Any, session))
            session.channels[3] = channel
            consumer = Consumer("c", channel, queue, False, False, 0, 0)
            channel.record_delivery(consumer, queue, 0, message, clock.monotonic)
            sessions = cast(Any, [session])
            assert await fail_timed_out(sessions, 200, clock.monotonic()) == 200
            clock.advance(0.199)  # a millisecond short of the timeout
            await fail_timed_out(sessions, 200, clock.monotonic())
            assert session.failed == []
            clock.advance(0.002)
            await fail_timed_out(sessions, 200, clock.monotonic())
            return session.failed

    failed = anyio.run(scenario)
    assert [number for number, _ in failed] == [3]
    assert isinstance(failed[0][1], PreconditionFailed)
    assert "Timeout value used: 200 ms" in str(failed[0][1])
