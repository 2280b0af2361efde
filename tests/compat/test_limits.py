"""Connection-level limits and liveness against a real gateway: heartbeats, disk alarm,
max connections, oversized messages."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import anyio
import pika
import pytest
from pamqp import body, commands, frame, header, heartbeat

from gateway.resources.alarms import Alarms, ResourceAlarm
from tests.harness.processes import GatewayProcess, check_for
from tests.harness.raw_client import handshake, read_frames


def test_a_silent_client_is_dropped_after_two_missed_heartbeats(gateway: GatewayProcess) -> None:
    sock, buffer = handshake(gateway.amqp_port, heartbeat_s=1)
    sock.settimeout(6)
    beats = 0
    with pytest.raises(ConnectionError):  # the server closes the socket on us
        while True:
            beats += sum(isinstance(f, heartbeat.Heartbeat) for f in read_frames(sock, buffer))
    sock.close()
    assert beats >= 1  # it sent heartbeats while it waited for ours
    check_for(5, lambda: "missed heartbeats from client, timeout: 1s" in gateway.log())


def test_a_client_that_sends_heartbeats_stays_connected(gateway: GatewayProcess) -> None:
    sock, buffer = handshake(gateway.amqp_port, heartbeat_s=1)
    sock.settimeout(6)
    seen = 0
    while seen < 4:  # four server heartbeats: well past two intervals
        for value in read_frames(sock, buffer):
            if isinstance(value, heartbeat.Heartbeat):
                seen += 1
                sock.sendall(frame.marshal(heartbeat.Heartbeat(), 0))
    sock.sendall(frame.marshal(commands.Queue.Declare(queue="alive"), 1))
    assert any(isinstance(f, commands.Queue.DeclareOk) for f in read_frames(sock, buffer))
    sock.close()


@pytest.fixture
def alarmed_gateway(tmp_path: Path) -> Iterator[GatewayProcess]:
    # A free-disk limit no disk can meet: the alarm is on from the start.
    env = {"MQGW_MIN_FREE_DISK_BYTES": str(2**62)}
    process = GatewayProcess(tmp_path / "data", env=env).start()
    yield process
    process.stop()


def test_disk_alarm_blocks_publishers_and_tells_them(alarmed_gateway: GatewayProcess) -> None:
    seen: list[object] = []
    sock, buffer = handshake(
        alarmed_gateway.amqp_port, capabilities={"connection.blocked": True}, seen=seen
    )
    sock.settimeout(5)
    blocked = [f for f in seen if isinstance(f, commands.Connection.Blocked)]
    assert blocked and blocked[0].reason == "low on disk"
    sock.sendall(frame.marshal(commands.Queue.Declare(queue="held"), 1))
    read_frames(sock, buffer)  # declare-ok: not a publisher yet, so still read
    sock.sendall(frame.marshal(commands.Confirm.Select(), 1))
    read_frames(sock, buffer)  # select-ok
    publish = commands.Basic.Publish(exchange="", routing_key="held")
    content = header.ContentHeader(0, 1, commands.Basic.Properties())
    message = (
        frame.marshal(publish, 1)
        + frame.marshal(content, 1)
        + frame.marshal(body.ContentBody(b"x"), 1)
    )
    sock.sendall(message)
    assert any(isinstance(f, commands.Basic.Ack) for f in read_frames(sock, buffer))
    # Now a publisher: the gateway stops reading it, so this declare goes unanswered.
    sock.sendall(message + frame.marshal(commands.Queue.Declare(queue="held", passive=True), 1))
    sock.settimeout(1.5)
    with pytest.raises(TimeoutError):
        read_frames(sock, buffer)
    # Other connections are served; the second publish was never read.
    other = pika.BlockingConnection(pika.URLParameters(alarmed_gateway.url))
    assert other.channel().queue_declare("held", passive=True).method.message_count == 1
    other.close()
    sock.close()
    check_for(5, lambda: "disk alarm" in alarmed_gateway.log())


def test_alarm_transitions_with_hysteresis() -> None:
    async def scenario() -> None:
        backlog = ResourceAlarm("store backlog", on_above=100, off_below=25)
        disk = ResourceAlarm("disk", on_above=0)
        alarms = Alarms(backlog, disk)
        assert backlog.update(100) is None and not alarms.blocked
        assert backlog.update(101) is True
        alarms.changed()
        assert alarms.blocked
        assert backlog.update(50) is None  # still above the clear mark
        with anyio.move_on_after(0.05) as scope:
            await alarms.wait_released()
        assert scope.cancelled_caught  # blocked: the wait does not return
        assert disk.update(10) is True
        assert backlog.update(24) is False
        alarms.changed()
        assert alarms.blocked  # the disk alarm still holds publishers
        assert disk.update(-5) is False
        alarms.changed()
        with anyio.fail_after(1):
            await alarms.wait_released()

    anyio.run(scenario)


def test_max_connections_refuses_the_next_one(tmp_path: Path) -> None:
    process = GatewayProcess(tmp_path / "data", env={"MQGW_MAX_CONNECTIONS": "2"}).start()
    try:
        first = pika.BlockingConnection(pika.URLParameters(process.url))
        second = pika.BlockingConnection(pika.URLParameters(process.url))
        with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as info:
            pika.BlockingConnection(pika.URLParameters(process.url))
        assert "connection limit (2) is reached" in str(info.value)
        second.close()
        third = pika.BlockingConnection(pika.URLParameters(process.url))  # room again
        assert third.is_open
        third.close()
        first.close()
    finally:
        process.stop()


def test_oversized_message_is_refused_and_nothing_is_stored(tmp_path: Path) -> None:
    process = GatewayProcess(tmp_path / "data", env={"MQGW_MAX_MESSAGE_SIZE_BYTES": "1000"}).start()
    try:
        conn = pika.BlockingConnection(pika.URLParameters(process.url))
        ch = conn.channel()
        ch.queue_declare("big")
        ch.basic_publish("", "big", b"x" * 1001)
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
            ch.queue_declare("big", passive=True)
        assert info.value.reply_code == 406
        assert "message size 1001 is larger than configured max size 1000" in info.value.reply_text
        ch = conn.channel()
        assert ch.queue_declare("big", passive=True).method.message_count == 0
        ch.basic_publish("", "big", b"x" * 1000)  # at the limit is fine
        assert ch.queue_declare("big", passive=True).method.message_count == 1
        conn.close()
    finally:
        process.stop()


def test_socket_closed_mid_frame_leaves_others_alone(gateway: GatewayProcess) -> None:
    sock, _ = handshake(gateway.amqp_port)
    sock.sendall(frame.marshal(commands.Queue.Declare(queue="half"), 1)[:9])
    sock.shutdown(socket.SHUT_RDWR)
    sock.close()
    conn = pika.BlockingConnection(pika.URLParameters(gateway.url))
    assert conn.channel().queue_declare("ok").method.queue == "ok"
    conn.close()
