"""Switching the firehose: `mqgw ctl trace on|off VHOST`, PUT /api/vhosts/{name} with
``{"tracing": ...}`` (RabbitMQ's shapes and answers), the flag across a restart, and no trace
copies while it is off."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pika

from bench.servers import GatewayServer
from tests.observability.conftest import start_gateway
from tests.observability.firehose_reader import FirehoseReader


def ctl_trace(gateway: GatewayServer, *args: str) -> subprocess.CompletedProcess[str]:
    admin = f"http://127.0.0.1:{gateway.admin_port}"
    command = [sys.executable, "-m", "mqgw_cli.main", "ctl", "trace", *args, "--admin", admin]
    return subprocess.run(command, capture_output=True, text=True, timeout=60)


def publish(gateway: GatewayServer, body: bytes, queue: str = "work") -> None:
    connection = pika.BlockingConnection(pika.URLParameters(gateway.url))
    try:
        channel = connection.channel()
        channel.queue_declare(queue)
        channel.basic_publish("", queue, body)
    finally:
        connection.close()


def traced_bodies(reader: FirehoseReader, count: int) -> list[bytes]:
    return [message.body for message in reader.wait_for(count)]


def test_ctl_trace_on_and_off_keeps_the_description_and_stops_the_copies(
    gateway: GatewayServer,
) -> None:
    assert (
        gateway.admin("PUT", "/api/vhosts/%2F", {"description": "main", "tags": "prod"})[0] == 204
    )
    assert gateway.admin("GET", "/api/vhosts/%2F")[1]["tracing"] is False
    done = ctl_trace(gateway, "on", "/")
    assert done.returncode == 0, done.stderr
    assert "tracing on for vhost '/'" in done.stderr
    shown = gateway.admin("GET", "/api/vhosts/%2F")[1]
    assert (shown["tracing"], shown["description"], shown["tags"]) == (True, "main", ["prod"])
    assert any(v["name"] == "/" and v["tracing"] for v in gateway.admin("GET", "/api/vhosts")[1])

    reader = FirehoseReader(gateway.amqp_port)
    try:
        publish(gateway, b"first")
        assert traced_bodies(reader, 1) == [b"first"]
        assert ctl_trace(gateway, "off").returncode == 0  # VHOST defaults to /
        assert gateway.admin("GET", "/api/vhosts/%2F")[1]["tracing"] is False
        publish(gateway, b"untraced")
        assert ctl_trace(gateway, "on", "/").returncode == 0
        publish(gateway, b"second")
        # Copies go out in order: had "untraced" been copied, it would come before "second".
        assert traced_bodies(reader, 2) == [b"first", b"second"]
    finally:
        reader.close()


def test_put_vhost_answers_as_rabbitmq(gateway: GatewayServer) -> None:
    status, error = gateway.admin("PUT", "/api/vhosts/%2F", {"tracing": "yes"})
    assert status == 400 and error["error"] == "bad_request" and "tracing" in error["reason"]
    assert gateway.admin("PUT", "/api/vhosts/shop", {"tracing": True})[0] == 201
    assert gateway.admin("GET", "/api/vhosts/shop")[1]["tracing"] is True
    # A PUT without "tracing" replaces description and tags and leaves the firehose alone.
    assert gateway.admin("PUT", "/api/vhosts/shop", {"description": "d"})[0] == 204
    shop = gateway.admin("GET", "/api/vhosts/shop")[1]
    assert (shop["tracing"], shop["description"]) == (True, "d")
    assert gateway.admin("PUT", "/api/vhosts/shop", {"tracing": False})[0] == 204
    shop = gateway.admin("GET", "/api/vhosts/shop")[1]
    assert (shop["tracing"], shop["description"]) == (False, "")
    # Only administrators switch it; a missing vhost is a 404 for the ctl command.
    body = {"password": "pw", "tags": "management"}
    assert gateway.admin("PUT", "/api/users/watcher", body)[0] == 201
    status, _ = gateway.admin("PUT", "/api/vhosts/shop", {"tracing": True}, ("watcher", "pw"))
    assert status == 403
    missing = ctl_trace(gateway, "on", "nowhere")
    assert missing.returncode == 1 and "404" in missing.stderr


def test_the_flag_survives_a_restart(tmp_path: Path) -> None:
    gateway = start_gateway(tmp_path / "data")
    try:
        assert gateway.admin("PUT", "/api/vhosts/%2F", {"tracing": True})[0] == 204
    finally:
        gateway.stop()
    gateway.start()
    try:
        assert gateway.admin("GET", "/api/vhosts/%2F")[1]["tracing"] is True
        reader = FirehoseReader(gateway.amqp_port)
        try:
            publish(gateway, b"after restart")
            assert traced_bodies(reader, 1) == [b"after restart"]
        finally:
            reader.close()
    finally:
        gateway.stop()
