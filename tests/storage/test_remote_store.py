"""What only the remote transport has: pipelining out of order, a broken client not hurting
the others, a graceful broker stop, cancellation, frame limits and closing."""

from __future__ import annotations

import logging
import struct
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest

from bench.servers import free_port
from storage import (
    BrokerUnavailable,
    EmbeddedStore,
    Record,
    StoreClosed,
    StoreConfig,
    connect_remote_store,
    open_embedded_store,
)
from storage.wire.frames import ProtocolError
from tests.harness.waiting import eventually
from tests.storage.helpers import bodies
from tests.storage.remote_helpers import served

pytestmark = [
    pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"]),
    pytest.mark.anyio,
]


class GatedStore(EmbeddedStore):
    """An embedded store whose durability waits until the test opens the gate."""

    def __init__(self, inner: EmbeddedStore) -> None:
        super().__init__(inner.log)
        self.gate = anyio.Event()
        self.waiting = 0

    async def wait_durable(self, end_offset: int) -> None:
        self.waiting += 1
        await self.gate.wait()
        await super().wait_durable(end_offset)


@asynccontextmanager
async def gated(tmp_path: Path) -> AsyncIterator[tuple[GatedStore, str]]:
    async with open_embedded_store(StoreConfig(tmp_path / "store")) as inner:
        store = GatedStore(inner)
        await store.create_queue(1, 1)
        async with served(store) as address:
            yield store, address


def rec(body: bytes) -> Record:
    return Record(b"ex", b"rk", b"", body, ((1, 0),))


async def test_a_read_is_answered_while_an_earlier_append_waits_for_durability(
    tmp_path: Path,
) -> None:
    async with gated(tmp_path) as (store, address), connect_remote_store(address) as remote:
        done: list[int] = []

        async def durable_append() -> None:
            result = await remote.append([rec(b"first")], wait_durable=True)
            done.append(result.record_count)

        async with anyio.create_task_group() as tg:
            tg.start_soon(durable_append)
            await eventually(5, lambda: store.waiting, "an append waiting", interval_s=0.005)
            # Same connection, later request: answered while the append is still unanswered.
            assert bodies((await remote.read(1, 0, 0)).messages) == [b"first"]
            assert done == []
            store.gate.set()
        assert done == [1]


async def test_a_broken_client_is_closed_alone(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "mqgw.storage.broker")
    async with gated(tmp_path) as (store, address), connect_remote_store(address) as remote:
        store.gate.set()
        host, port = address.split(":")
        async with await anyio.connect_tcp(host, int(port)) as raw:
            await raw.send(struct.pack("<IIB", 0xFFFF_FFF0, 1, 1))  # absurd frame length
            with anyio.fail_after(5), pytest.raises((anyio.EndOfStream, anyio.BrokenResourceError)):
                await raw.receive()
        await remote.append([rec(b"still fine")])
        assert bodies((await remote.read(1, 0, 0)).messages) == [b"still fine"]
    assert "protocol error, closing it: frame length 4294967280" in caplog.text
    assert "closed after 0 request(s): protocol error" in caplog.text


async def test_broker_stop_answers_what_is_in_flight_then_closes(tmp_path: Path) -> None:
    async with open_embedded_store(StoreConfig(tmp_path / "store")) as inner:
        store = GatedStore(inner)
        await store.create_queue(1, 1)
        stop = anyio.Event()
        async with (
            served(store, stop=stop) as address,
            # long enough for the first handshake on a loaded machine; the last call below
            # still fails within it
            connect_remote_store(address, unavailable_wait_s=2.0) as remote,
        ):
            results: list[int] = []

            async def append() -> None:
                results.append((await remote.append([rec(b"in flight")])).record_count)

            async with anyio.create_task_group() as tg:
                tg.start_soon(append)
                await eventually(5, lambda: store.waiting, "an append waiting", interval_s=0.005)
                stop.set()
                host, port = address.split(":")
                with anyio.fail_after(5):  # the listener goes first
                    while True:
                        try:
                            await (await anyio.connect_tcp(host, int(port))).aclose()
                        except OSError:
                            break
                        await anyio.sleep(0.005)
                store.gate.set()  # the fsync it waited for: its answer still goes out
            assert results == [1]
            with pytest.raises(BrokerUnavailable):
                await remote.queues()
        assert bodies((await store.read(1, 0, 0)).messages) == [b"in flight"]


async def test_cancelled_call_leaves_the_connection_usable(tmp_path: Path) -> None:
    async with gated(tmp_path) as (store, address), connect_remote_store(address) as remote:
        with anyio.move_on_after(0.05):
            await remote.append([rec(b"given up on")])
        store.gate.set()  # its answer arrives for nobody, and is dropped
        assert (await remote.append([rec(b"next")])).record_count == 1
        assert bodies((await remote.read(1, 0, 0)).messages) == [b"given up on", b"next"]


async def test_frame_limit_and_closing(tmp_path: Path) -> None:
    async with gated(tmp_path) as (store, address):
        store.gate.set()
        async with connect_remote_store(address, max_frame_bytes=1 << 20) as remote:
            with pytest.raises(ProtocolError, match="exceeds the frame limit"):
                await remote.append([rec(b"x" * (2 << 20))])
            await remote.append([rec(b"small")])  # nothing was sent: the link is fine
        with pytest.raises(StoreClosed):
            await remote.queues()


async def test_first_connection_failing_is_broker_unavailable() -> None:
    with pytest.raises(BrokerUnavailable, match=r"unavailable for 0\.2 s"):
        async with connect_remote_store(f"127.0.0.1:{free_port()}", unavailable_wait_s=0.2):
            pass


async def test_calls_fail_at_once_once_the_broker_is_away_past_the_wait(tmp_path: Path) -> None:
    """A call waits for a lost broker up to unavailable_wait_s after the link went down, not
    after each call: a gateway's every store call must not block that long while a broker
    group is down. Back, the broker is used again."""
    async with open_embedded_store(StoreConfig(tmp_path / "store")) as inner:
        await inner.create_queue(1, 1)
        port = free_port()
        stop = anyio.Event()
        async with (
            served(inner, port=port, stop=stop) as address,
            connect_remote_store(address, unavailable_wait_s=2.0) as remote,
        ):
            assert (await remote.append([rec(b"up")])).record_count == 1
            stop.set()
            with anyio.fail_after(10):
                while remote.connected:
                    await anyio.sleep(0.01)
            started = anyio.current_time()
            with pytest.raises(BrokerUnavailable):
                await remote.queues()  # waits out what is left of the 2 s
            assert anyio.current_time() - started > 1.0
            with anyio.fail_after(1.0), pytest.raises(BrokerUnavailable):
                await remote.queues()  # the outage is older than the wait: at once
            async with served(inner, port=port):
                with anyio.fail_after(10):
                    while not remote.connected:
                        await anyio.sleep(0.01)
                assert 1 in await remote.queues()
