"""`mqgw serve`: run an embedded gateway node until SIGTERM/SIGINT.

Shutdown order: stop accepting, close every connection with 320 CONNECTION_FORCED, commit
consumer offsets, then close the store (fsync, checkpoint, offsets) on the way out.
The admin HTTP server (uvicorn) needs the asyncio backend; under trio it is not started.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from typing import cast

import anyio
import sniffio
import uvicorn
from anyio.abc import SocketListener, SocketStream, TaskGroup
from anyio.streams.stapled import MultiListener

from gateway.admin.app import create_app
from gateway.cluster.backends import open_cluster_backends
from gateway.cluster.backlog import RemoteBacklog, report_progress
from gateway.cluster.link import ClusterLink
from gateway.config.settings import GatewaySettings
from gateway.features.delayed_exchange import EXCHANGE_TYPES
from gateway.net.listeners import describe, open_listener
from gateway.net.tls import ReloadingContext, TLSSettingsError, TLSSetup, serve_tls_connection
from gateway.node import Node
from gateway.sessions.connection_io import serve_connection
from gateway.vhost.group_mover import LEASE_MS
from meta.local_store import LocalMetadataStore
from meta.move_jobs import SharedMoveJob
from meta.redis_store import RedisMetadataStore
from meta.store import MetadataStore
from storage import BrokerUnavailable, DiskFull, StoreLocked, StorePort, open_embedded_store, twins
from storage.broker.gc_tuning import tune_gc
from storage.config import max_record_bytes_for
from storage.rocketmq import connect_rocketmq_store

log = logging.getLogger("mqgw.server")


@asynccontextmanager
async def _backends(settings: GatewaySettings) -> AsyncIterator[tuple[StorePort, MetadataStore]]:
    """Embedded: the store and the metadata file under the data directory. Cluster (--meta):
    Redis and a broker (gateway/cluster/link.py)."""
    if settings.store:
        async with _rocketmq_backends(settings) as backends:
            yield backends
        return
    if settings.meta:
        # Nothing of the cluster's is kept here; the directory is still the gateway's own
        # (the disk alarm reads it; the broker has its own alarm for the messages).
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        async with open_cluster_backends(settings, frozenset(EXCHANGE_TYPES)) as (store, meta):
            yield store, meta
        return
    async with AsyncExitStack() as stack:
        try:
            embedded = await stack.enter_async_context(open_embedded_store(settings.store_config()))
            local = LocalMetadataStore(
                settings.data_dir / "meta",
                exchange_types=EXCHANGE_TYPES,
                default_user=not settings.users,
            )
        except StoreLocked as error:
            raise StartFailure(f"cannot start: the store {error} (another node?)") from None
        except OSError as error:
            where = f" ({error.filename})" if error.filename else ""
            raise StartFailure(
                f"data directory {settings.data_dir} is not usable{where}: {_why(error)}"
            ) from None
        yield embedded, local


@asynccontextmanager
async def _rocketmq_backends(
    settings: GatewaySettings,
) -> AsyncIterator[tuple[StorePort, MetadataStore]]:
    """--store rocketmq://: the messages in RocketMQ; the metadata in Redis (--meta, shared
    with the other gateways) or, alone, in the data directory."""
    assert settings.store is not None
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    max_record = max_record_bytes_for(settings.max_message_size_bytes)
    async with AsyncExitStack() as stack:
        try:
            store = await stack.enter_async_context(
                connect_rocketmq_store(settings.store, max_record)
            )
        except BrokerUnavailable as error:
            raise StartFailure(f"RocketMQ store {settings.store} unreachable: {error}") from None
        log.info("messages in RocketMQ at %s", settings.store)
        if not settings.meta:
            yield store, LocalMetadataStore(settings.data_dir / "meta",
                                            exchange_types=EXCHANGE_TYPES,
                                            default_user=not settings.users)  # fmt: skip
            return
        meta = RedisMetadataStore(settings.meta, exchange_types=frozenset(EXCHANGE_TYPES),
                                  default_user=not settings.users)  # fmt: skip
        try:
            yield store, meta
        finally:
            with anyio.CancelScope(shield=True):
                await meta.close()


async def serve(
    settings: GatewaySettings, on_ready: Callable[[int, int], None] | None = None
) -> None:
    tls = TLSSetup.from_settings(settings)  # a TLS setting that cannot work stops us here
    async with _backends(settings) as (store, meta):
        node, link = _new_node(settings, store, meta)
        try:
            await node.start()
            position = await link.start() if link is not None else ""
        except BrokerUnavailable as error:  # its queues and timers are made at the start
            raise StartFailure(f"cannot start: the message store did not answer: {error}") from None
        tune_gc()  # (storage/broker/gc_tuning.py)
        listener = await _listen(settings.amqp_host, settings.amqp_port, settings.reuse_port)
        amqp_port = listener.extra(anyio.abc.SocketAttribute.local_port)
        tls_listener = (
            await _listen(settings.amqp_host, settings.tls_port, settings.reuse_port)
            if tls.amqp
            else None
        )
        admin_socket = (  # bound here: a port in use stops the start with one line
            _admin_socket(settings)
            if settings.admin_port and sniffio.current_async_library() == "asyncio"
            else None
        )

        async with anyio.create_task_group() as tg:
            _start_node_tasks(tg, node, link, position)
            for socket_listener in listener.listeners:
                tg.start_soon(_accept_loop, tg, node, cast(SocketListener, socket_listener))
            for socket_listener in tls_listener.listeners if tls_listener else ():
                tg.start_soon(
                    _accept_loop, tg, node, cast(SocketListener, socket_listener), tls.amqp
                )
            if tls.contexts:
                await tg.start(tls.watch)  # SIGHUP and file changes reload certificates
            admin_port = 0
            if admin_socket is not None:
                admin_port = await tg.start(_serve_admin, node, settings, tls.admin, admin_socket)
            _log_ready(node, settings, listener, tls_listener, admin_port, tls.admin is not None)
            if on_ready is not None:
                on_ready(amqp_port, admin_port)
            with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                async for signum in signals:
                    log.info("received %s: shutting down", signal.Signals(signum).name)
                    break
            await listener.aclose()
            if tls_listener is not None:
                await tls_listener.aclose()
            await node.shutdown()
            tg.cancel_scope.cancel()
    log.info("mqgw stopped cleanly")


# docs/rocketmq.md ("What differs"): mqgw's brokers refuse what a gateway that has not yet
# seen a change appends after a partition's closing record; RocketMQ takes it.
CLOSING_OVER_ROCKETMQ = (
    "a change that closes a partition (shrink, split, merge, move) is refused over RocketMQ "
    "with shared metadata: RocketMQ does not refuse another gateway's writes after a closing "
    "record, so messages could land behind it (growing is allowed)"
)


def _new_node(
    settings: GatewaySettings, store: StorePort, meta: MetadataStore
) -> tuple[Node, ClusterLink | None]:
    """The node on its backends; with Redis metadata (a cluster) also its cluster link."""
    node = Node(settings, store, meta)
    link = ClusterLink(node, meta, node.controls) if isinstance(meta, RedisMetadataStore) else None
    node.cluster = link
    if link is not None:
        node.remote_backlog = RemoteBacklog(node.store)
        node.breakers.watch_all = True
        node.group_mover.records = SharedMoveJob(link.meta, node.name, LEASE_MS)
        if settings.store is not None:
            node.closing_refused = CLOSING_OVER_ROCKETMQ
    return node, link


def _start_node_tasks(tg: TaskGroup, node: Node, link: ClusterLink | None, position: str) -> None:
    """The node's long-running tasks; with a cluster link, following the change feed from
    ``position`` and reporting the queues' progress."""
    tg.start_soon(node.scheduler.run)
    tg.start_soon(node.timer.run)
    tg.start_soon(node.housekeeping)
    tg.start_soon(node.dead_letter_loop)
    tg.start_soon(node.consumer_timeout_loop)
    tg.start_soon(node.gray.run)
    tg.start_soon(node.routes.run)
    tg.start_soon(node.breakers.run)
    tg.start_soon(node.group_mover.run)
    tg.start_soon(node.autoscaler.run)
    if link is not None:
        tg.start_soon(link.run, position)
        tg.start_soon(report_progress, node.all_queues)


async def _accept_loop(
    tg: TaskGroup,
    node: Node,
    socket_listener: SocketListener,
    tls_context: ReloadingContext | None = None,
) -> None:
    # Connections run in the outer group so that closing the listener stops
    # accepting without cutting them off: they get their 320 close first.
    while True:
        try:
            stream = await socket_listener.accept()
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            return
        if tls_context is None:
            tg.start_soon(serve_connection, node, stream)
        else:  # the handshake runs in the connection's task, not here
            tg.start_soon(serve_tls_connection, node, stream, tls_context)


def _log_ready(
    node: Node,
    settings: GatewaySettings,
    listener: MultiListener[SocketStream],
    tls_listener: MultiListener[SocketStream] | None,
    admin_port: int,
    admin_https: bool,
) -> None:
    """The one line that says the gateway is serving, and where."""
    https = " (https)" if admin_https else ""
    what = (
        f"metadata {settings.meta}, gateway {node.name}"
        if node.cluster is not None
        else f"data in {settings.data_dir} (flush {settings.flush.value})"
    )
    _log_hot_paths()
    log.info(
        "mqgw %s ready: AMQP on %s, admin on %s, %s%s",
        "cluster gateway" if node.cluster is not None else "embedded node",
        describe(listener),
        f"{settings.admin_host}:{admin_port}{https}" if admin_port else "off",
        f"AMQPS on {describe(tls_listener)}, " if tls_listener else "",
        what,
    )


def _log_hot_paths() -> None:
    """`compiled hot paths: yes` or `no (reason)`, as `mqgw --version` says it: a warning when
    they were not built (a build without a C compiler), not when the environment disabled them."""
    compiled, reason = twins.status()
    quiet = compiled or reason.startswith("disabled")
    log.log(logging.INFO if quiet else logging.WARNING, "%s", twins.status_line())


def _has_uvloop() -> bool:
    try:
        import uvloop  # noqa: F401, PLC0415 - only probing whether it is installed
    except ImportError:
        log.info("uvloop not installed: running on the standard asyncio event loop")
        return False
    return True


async def _serve_admin(
    node: Node,
    settings: GatewaySettings,
    tls: ReloadingContext | None,
    sock: socket.socket,
    *,
    task_status: anyio.abc.TaskStatus[int],
) -> None:
    config = uvicorn.Config(
        create_app(node),
        host=settings.admin_host,
        port=settings.admin_port,
        log_config=None,  # our handlers and levels (gateway/config/logging_setup.py: "admin")
        lifespan="off",
    )
    if tls is not None:  # HTTPS: our context (reloaded in place), not one uvicorn builds
        config.load()
        config.ssl = tls.context
    server = uvicorn.Server(config)
    task_status.started(sock.getsockname()[1])
    await server.serve(sockets=[sock])


class StartFailure(SystemExit):
    """A foreseeable reason the gateway cannot start: one line and exit status 1, never a
    traceback (mqgw_cli prints it as it is)."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"mqgw serve: {reason}")


def _why(error: OSError) -> str:
    """ "address already in use": the system's words for the errno, lower case."""
    return os.strerror(error.errno).lower() if error.errno else str(error)


async def _listen(host: str, port: int, reuse_port: bool) -> MultiListener[SocketStream]:
    try:
        return await open_listener(host, port, reuse_port)
    except OSError as error:
        raise StartFailure(f"cannot listen on {host}:{port}: {_why(error)}") from None


def _admin_socket(settings: GatewaySettings) -> socket.socket:
    """The admin listen socket, bound as uvicorn binds one (SO_REUSEADDR); with
    ``reuse_port`` also SO_REUSEPORT (uvicorn's own binding cannot set it), so the workers of
    `mqgw serve --workers` share the admin port as they share AMQP's."""
    host = settings.admin_host
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)  # as uvicorn
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if settings.reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, settings.admin_port))
    except OSError as error:
        sock.close()
        raise StartFailure(
            f"cannot listen on {host}:{settings.admin_port} (admin API): {_why(error)}"
        ) from None
    sock.set_inheritable(True)
    return sock


def run(settings: GatewaySettings, backend: str = "asyncio") -> None:
    options = {"use_uvloop": _has_uvloop()} if backend == "asyncio" else {}
    try:
        anyio.run(serve, settings, backend=backend, backend_options=options)
    except (TLSSettingsError, DiskFull) as error:  # DiskFull: only a brand new store
        raise StartFailure(f"cannot start: {error}") from None
    except BaseExceptionGroup as group:  # raised through a task group (cluster mode)
        failure = _start_failure(group)
        if failure is None:
            raise
        raise failure from None


def _start_failure(error: BaseException) -> StartFailure | None:
    """The StartFailure in ``error``, however deep in exception groups."""
    if isinstance(error, StartFailure):
        return error
    if isinstance(error, BaseExceptionGroup):
        for inner in error.exceptions:
            found = _start_failure(inner)
            if found is not None:
                return found
    return None
