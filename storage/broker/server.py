"""`mqgw broker`'s server: accepts connections and serves the store on each.

Each connection is a ``BrokerConnection`` (storage/broker/connection.py: the store API over
the broker protocol, storage/wire/protocol.py). A broker stop closes the listener, stops
every connection reading, lets each answer what is in flight (bounded), closes the
connections, then the store (flush, checkpoint, offsets) on the way out.
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable
from typing import cast

import anyio
from anyio.abc import SocketAttribute, SocketListener, SocketStream
from anyio.streams.stapled import MultiListener

from storage.broker.connection import BrokerConnection
from storage.broker.limits import ReadWaits
from storage.broker.store_calls import ready_bytes_of
from storage.clients.link import enable_keepalive
from storage.config import StoreConfig
from storage.log.embedded import open_embedded_store
from storage.port import StorePort
from storage.replication.replicated_store import ReplicatedStore
from storage.wire.frames import MAX_FRAME_BYTES

log = logging.getLogger("mqgw.storage.broker")

Ready = Callable[[str, int], None]  # (host, port) once listening


class BrokerServer:
    """Accepts connections and serves ``store`` on each until ``stop`` is set."""

    def __init__(
        self,
        store: StorePort,
        name: str = "broker",
        max_frame_bytes: int = MAX_FRAME_BYTES,
        replicated: ReplicatedStore | None = None,
    ) -> None:
        self.store = store
        self.replicated = replicated
        self.name = name
        self.max_frame_bytes = max_frame_bytes
        self.connections: set[BrokerConnection] = set()
        self.waits = ReadWaits()
        self.ready_bytes = ready_bytes_of(store, replicated)

    async def serve(self, listener: MultiListener[SocketStream], stop: anyio.Event) -> None:
        async with anyio.create_task_group() as tg:
            for one in listener.listeners:  # a name may bind several addresses
                tg.start_soon(self._accept_loop, cast(SocketListener, one), tg)
            await stop.wait()
            await listener.aclose()
            if self.connections:
                log.info("broker stopping: finishing %d connection(s)", len(self.connections))
            for connection in list(self.connections):
                connection.stop()

    async def _accept_loop(self, listener: SocketListener, tg: anyio.abc.TaskGroup) -> None:
        while True:
            try:
                stream = await listener.accept()
            except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                return
            tg.start_soon(self._serve_connection, stream)

    async def _serve_connection(self, stream: SocketStream) -> None:
        enable_keepalive(stream)  # a gateway host that vanished: its connection goes too
        connection = BrokerConnection(
            self.store,
            stream,
            self.name,
            self.max_frame_bytes,
            self.replicated,
            self.waits,
            self.ready_bytes,
        )
        log.info("broker connection from %s opened", connection.peer)
        self.connections.add(connection)
        try:
            async with stream:
                reason = await connection.run()
        except Exception as error:  # one connection never stops the broker
            log.exception("broker connection from %s failed", connection.peer)
            reason = f"internal error: {error!r}"
        finally:
            self.connections.discard(connection)
        log.info(
            "broker connection from %s (%s) closed after %d request(s): %s",
            connection.peer,
            connection.client,
            connection.requests,
            reason,
        )


async def _stop_on_signals(stop: anyio.Event) -> None:
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for signum in signals:
            log.info("received %s: shutting down", signal.Signals(signum).name)
            stop.set()
            return


async def serve_store(
    store: StorePort,
    host: str = "127.0.0.1",
    port: int = 0,
    ready: Ready | None = None,
    *,
    name: str = "broker",
    stop: anyio.Event | None = None,
    max_frame_bytes: int = MAX_FRAME_BYTES,
    replicated: ReplicatedStore | None = None,
) -> None:
    """Serve an open store until ``stop`` is set (None: until SIGTERM or SIGINT)."""
    listener = await anyio.create_tcp_listener(local_host=host, local_port=port)
    bound = listener.extra(SocketAttribute.local_port)
    server = BrokerServer(store, name, max_frame_bytes, replicated)
    async with anyio.create_task_group() as tg:
        if stop is None:
            stop = anyio.Event()
            tg.start_soon(_stop_on_signals, stop)
        if ready is not None:
            ready(host, bound)
        await server.serve(listener, stop)
        tg.cancel_scope.cancel()


async def serve_broker(
    config: StoreConfig,
    host: str = "127.0.0.1",
    port: int = 0,
    ready: Ready | None = None,
    *,
    name: str = "broker",
    stop: anyio.Event | None = None,
    max_frame_bytes: int = MAX_FRAME_BYTES,
) -> None:
    """Open the store in ``config.data_dir`` (recovering it) and serve it; on stop, close it
    cleanly. ``ready(host, port)`` is called once listening (port 0: the port chosen)."""
    async with open_embedded_store(config) as store:
        await serve_store(
            store, host, port, ready, name=name, stop=stop, max_frame_bytes=max_frame_bytes
        )
    log.info("broker %s stopped; store %s closed cleanly", name, config.data_dir)
