"""The only code that touches a client socket: read, feed the session, write, heartbeat."""

from __future__ import annotations

import logging
import time

import anyio
from anyio.abc import ByteStream, SocketAttribute
from anyio.streams.tls import TLSAttribute

from gateway.amqp import ServerConnection, frame_writer
from gateway.amqp.sasl import certificate_login
from gateway.sessions.host import SessionHost
from gateway.sessions.session import Session

log = logging.getLogger("mqgw.connection")

READ_SIZE = 256 << 10
CLOSE_OK_TIMEOUT_S = 3.0


def _certificate_login(stream: ByteStream) -> str | None:
    """A TLS client certificate's CN once verified (EXTERNAL is offered then), else None."""
    certificate = stream.extra(TLSAttribute.peer_certificate, None)
    return certificate_login(certificate) if certificate else None


def _address(stream: ByteStream, remote: bool) -> str:
    attribute = SocketAttribute.remote_address if remote else SocketAttribute.local_address
    address = stream.extra(attribute, None)
    if isinstance(address, tuple):
        return f"{address[0]}:{address[1]}"
    return str(address)


async def serve_connection(node: SessionHost, stream: ByteStream) -> None:
    settings = node.settings
    conn = ServerConnection(
        channel_max=settings.channel_max,
        frame_max=settings.frame_max,
        heartbeat_s=settings.heartbeat_s,
        max_message_size=settings.max_message_size_bytes,
        # RabbitMQ's cluster_name defaults to its node's name.
        server_properties={"cluster_name": settings.node_name},
        external_login=_certificate_login(stream),
    )
    session = Session(
        node,
        conn,
        _address(stream, remote=True),
        _address(stream, remote=False),
    )
    if not node.admit(session):
        await stream.aclose()
        return
    node.sessions.add(session)
    try:
        async with stream, anyio.create_task_group() as tg:
            writer_done = anyio.Event()
            tg.start_soon(_handshake_watchdog, session, stream, settings.handshake_timeout_ms)
            tg.start_soon(_write_loop, session, stream, writer_done)
            tg.start_soon(session.confirm_loop)
            await _read_loop(session, stream)
            session.mark_dirty()
            # Our close (or theirs) is queued: give the client time to answer, and the writer
            # time to send the last frames (close-ok), then go. Only the writer writes: a
            # second sender, or cancelling it mid-send, could lose the close-ok.
            with anyio.move_on_after(CLOSE_OK_TIMEOUT_S):
                while not conn.closed:
                    data = await stream.receive(READ_SIZE)
                    await session.handle_events(conn.receive_data(data))
                    session.mark_dirty()
                session.mark_dirty()
                await writer_done.wait()
            tg.cancel_scope.cancel()
    except Exception as error:  # ExceptionGroup included: one connection never stops the node
        if not _is_disconnect(error):
            log.exception("connection %s failed", session.id, extra={"connection": session.name})
            session.close_reason = session.close_reason or f"internal error: {error!r}"
    finally:
        with anyio.CancelScope(shield=True):
            if not session.close_reason:
                session.close_reason = _gone(session, "client went away")
            await session.release()
        node.sessions.discard(session)
        node.gray.detach(session)


_DISCONNECTS = (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError, OSError)


def _is_disconnect(error: BaseException) -> bool:
    """True when ``error`` (or every error inside a group) is the peer going away."""
    if isinstance(error, BaseExceptionGroup):
        return all(_is_disconnect(e) for e in error.exceptions)
    return isinstance(error, _DISCONNECTS)


def _gone(session: Session, otherwise: str) -> str:
    """Why a connection ended when its socket went: the close we had sent, if any (a
    shutdown's 320: pika closes the socket without answering close-ok), else ``otherwise``."""
    sent = session.conn.close_awaited
    return sent.reply_text if sent is not None else otherwise


async def _read_loop(session: Session, stream: ByteStream) -> None:
    conn = session.conn
    while not conn.closed and not session.closing:
        await session.wait_until_may_read()
        try:
            data = await stream.receive(session.read_size(READ_SIZE))
        except (anyio.EndOfStream, anyio.BrokenResourceError):
            session.close_reason = session.close_reason or _gone(
                session, "client closed the socket"
            )
            return
        await session.handle_events(conn.receive_data(data))
        session.mark_dirty()


async def _handshake_watchdog(session: Session, stream: ByteStream, timeout_ms: int) -> None:
    """RabbitMQ's handshake_timeout: a client that has not opened its vhost within the
    timeout (protocol header, start-ok, tune-ok, open) is disconnected, with a log line."""
    if timeout_ms <= 0:
        return
    with anyio.move_on_after(timeout_ms / 1000):
        await session.vhost_opened.wait()
        return
    if session.opened or session.closing:
        return
    state = session.conn.state.value
    session.close_reason = f"handshake timeout ({timeout_ms} ms) in state {state}"
    log.warning(
        "closing connection %s from %s: no handshake within %d ms (state %s)",
        session.id, session.peer, timeout_ms, state, extra={"connection": session.name},
    )  # fmt: skip
    await stream.aclose()


async def _flush(session: Session, stream: ByteStream) -> None:
    # A piece at a time: the transport copies what the socket does not take at once, so a
    # large delivery written whole would be held again in its buffer.
    for data in frame_writer.coalesce(session.take_output()):
        await stream.send(data)
    session.sent()


async def _write_loop(session: Session, stream: ByteStream, done: anyio.Event) -> None:
    """The connection's only writer: coalesced output, heartbeats, the final close frames."""
    conn = session.conn
    try:
        while True:
            interval = max(conn.heartbeat_s / 2, 0.5) if conn.heartbeat_s else 5.0
            with anyio.move_on_after(interval):
                await session.dirty.wait()
            session.take_dirty()
            conn.tick(time.monotonic())
            await _flush(session, stream)
            if conn.timed_out is not None:
                session.close_reason = (
                    f"missed heartbeats from client, timeout: {conn.heartbeat_s}s"
                )
                await stream.aclose()
                return
            if conn.closed:
                await _flush(session, stream)  # anything queued while the last send ran
                return
    finally:
        done.set()
