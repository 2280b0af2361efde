"""Write-through keeps publish order when a publish has gone to the store: while a session's
append is out, or when one lands while a read is on its way back (a cluster's long-poll and
take-over reads), the next transient message must not overtake it (QueueRuntime.appending,
appends_done). The cluster's fill also recounts ready from the ends its reads saw, which is
what let a stored message be forgotten."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio

from gateway.queues.runtime import QueueRuntime
from gateway.queues.scheduler import PushScheduler
from gateway.vhost import VirtualHost
from storage import EmbeddedStore, ReadResult, Record, open_embedded_store
from tests.gateway.queues.test_push_scheduler import _config, _consume
from tests.gateway.queues.test_serve_fed import _caught_up, _vhost
from tests.harness.stub_session import StubSession


class HeldReads:
    """Reads of the store that, once armed, wait after the store answered: the answer is on
    its way back while other things happen."""

    def __init__(self, store: EmbeddedStore) -> None:
        self._read = store.read
        self.answered = anyio.Event()
        self.release: anyio.Event | None = None
        store.read = self.read  # type: ignore[method-assign]

    async def read(self, *args: Any, **kwargs: Any) -> ReadResult:
        result = await self._read(*args, **kwargs)
        release = self.release
        if release is not None:
            self.release = None
            self.answered.set()
            await release.wait()
        return result


async def _publish_stored(vhost: VirtualHost, queue: QueueRuntime, body: bytes) -> None:
    """What Session.publish_batch does with a message that is not written through."""
    record = Record(b"", queue.name.encode(), b"", body, ((queue.queue_id, 0),))
    queue.count_in(len(body))
    queue.appending += 1
    try:
        result = await vhost.store.append([record], wait_durable=False)
        await vhost.stored({queue}, [record], result)
    finally:
        queue.appending -= 1


def _bodies(session: StubSession) -> list[bytes]:
    return [bytes(body) for _, body, _ in session.deliveries]


def test_an_append_landing_behind_a_read_is_not_overtaken(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with open_embedded_store(_config(tmp_path / "store")) as store:
            scheduler = PushScheduler(quota=64)
            vhost = await _vhost(store, tmp_path, scheduler)
            queue = await _caught_up(vhost, "live")
            queue.leases = [True]  # as in a cluster: fills recount ready from the ends seen
            session = StubSession()
            _consume(session, queue, no_ack=True)
            assert queue.deliver_now("", "live", b"", b"m0", 0)  # caught up: straight through
            reads = HeldReads(store)
            reads.release = release = anyio.Event()
            async with anyio.create_task_group() as tasks:
                queue.exhausted = False  # as a long-poll read that found something does
                tasks.start_soon(queue.fill)
                await reads.answered.wait()  # the read saw an empty partition...
                await _publish_stored(vhost, queue, b"m1")  # ...and m1 landed behind it
                release.set()
            assert not queue.exhausted  # the end the read saw is not the end
            assert not queue.deliver_now("", "live", b"", b"m2", 0)
            await _publish_stored(vhost, queue, b"m2")
            while await scheduler.turn():
                pass
            assert _bodies(session) == [b"m0", b"m1", b"m2"]
            assert queue.deliver_now("", "live", b"", b"m3", 0)  # caught up again
            assert _bodies(session)[-1] == b"m3"

    anyio.run(scenario)


def test_nothing_is_written_through_while_an_append_is_out(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with open_embedded_store(_config(tmp_path / "store")) as store:
            vhost = await _vhost(store, tmp_path, PushScheduler(quota=64))
            queue = await _caught_up(vhost, "live")
            session = StubSession()
            _consume(session, queue, no_ack=True)
            queue.appending = 1
            assert not queue.deliver_now("", "live", b"", b"t", 0)
            queue.appending = 0
            assert queue.deliver_now("", "live", b"", b"t", 0)
            assert _bodies(session) == [b"t"]

    anyio.run(scenario)
