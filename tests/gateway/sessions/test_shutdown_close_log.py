"""A SIGTERM closes every connection with 320 CONNECTION_FORCED; the log line of each
connection says so, whatever the client does with the close (a real gateway process)."""

from __future__ import annotations

import signal
import threading
from pathlib import Path

import pika
import pika.exceptions

from tests.harness.processes import GatewayProcess

SHUTDOWN = "(CONNECTION_FORCED - broker forced connection closure with reason 'shutdown')"


def test_sigterm_logs_the_servers_close_not_the_client_going(tmp_path: Path) -> None:
    gateway = GatewayProcess(tmp_path / "data").start()
    try:
        # pika answers the server's connection.close by closing its socket, no close-ok: the
        # gateway read end-of-stream and logged "client closed the socket".
        answering = pika.BlockingConnection(pika.URLParameters(gateway.url))
        # This one never reads, so it never sees the close: the gateway gives up on it.
        silent = pika.BlockingConnection(pika.URLParameters(gateway.url))
        closed = threading.Event()

        def pump() -> None:
            try:
                while answering.is_open:
                    answering.process_data_events(0.05)
            except pika.exceptions.AMQPConnectionError:
                closed.set()

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        assert silent.is_open
        assert gateway.stop(signal.SIGTERM) == 0
        reader.join(10)
        assert closed.is_set(), "the reading client did not see the server's close"
    finally:
        gateway.kill()
    lines = [line for line in gateway.log().splitlines() if "closing AMQP connection" in line]
    assert len(lines) == 2, gateway.log()
    for line in lines:
        assert line.endswith(SHUTDOWN), line
