"""Limits, compared with RabbitMQ 3.10: message size (default and configured) and
channel_max, which counts open channels whatever their numbers."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pamqp import commands as c

from tests.diff.raw import RawClient
from tests.diff.support import Server, describe, run_both
from tests.harness.processes import GatewayProcess
from tests.harness.rabbitmq import RabbitMQProcess

SMALL_MAX = 1000


class _ConfiguredRabbitMQ(RabbitMQProcess):
    """RabbitMQ with lines added to the rabbitmq.conf the launcher writes."""

    def __init__(self, base_dir: Path, conf_lines: str) -> None:
        super().__init__(base_dir)
        self.conf_lines = conf_lines

    def _env(self, epmd_port: int, dist_port: int) -> dict[str, str]:
        env = super()._env(epmd_port, dist_port)
        config = self.base_dir / "rabbitmq.conf"
        config.write_text(config.read_text() + self.conf_lines)
        return env


@pytest.fixture(scope="module")
def small_max_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Server]]:
    """Both servers with max_message_size = 1000 (RabbitMQ: rabbitmq.conf)."""
    rabbit = _ConfiguredRabbitMQ(
        tmp_path_factory.mktemp("rabbitmq-small"), f"max_message_size = {SMALL_MAX}\n"
    ).start()
    gateway = GatewayProcess(
        tmp_path_factory.mktemp("gateway-small") / "data",
        ["--max-message-size-bytes", str(SMALL_MAX)],
    ).start()
    try:
        yield [Server("rabbitmq", rabbit.amqp_port), Server("gateway", gateway.amqp_port)]
    finally:
        gateway.stop()
        rabbit.stop()


def _oversized(size: int) -> Any:
    """A small message (acked), then one of ``size`` bytes (refused), then the queue's count."""

    def scenario(server: Server, p: str) -> Any:
        with server.raw(timeout_s=60) as client:
            client.open_channel(1)
            seen = [describe(client.rpc(1, c.Queue.Declare(queue=f"{p}-q")))]
            seen.append(describe(client.rpc(1, c.Confirm.Select())))
            client.publish(1, "", f"{p}-q", b"x" * SMALL_MAX)
            seen.append(describe(client.next_item(1)))  # its ack
            client.publish(1, "", f"{p}-q", b"y" * size)
            seen.append(describe(client.next_item(1, timeout_s=60)))  # RabbitMQ reads it all
            client.send(1, c.Channel.CloseOk())
            client.open_channel(2)
            # Nothing of the refused message was stored.
            seen.append(describe(client.rpc(2, c.Queue.Declare(queue=f"{p}-q", passive=True))))
            client.rpc(2, c.Queue.Delete(queue=f"{p}-q"))
            return seen

    return scenario


def test_message_above_the_configured_maximum(small_max_servers: list[Server], names: str) -> None:
    rabbit, gateway = run_both(small_max_servers, _oversized(SMALL_MAX + 1), names)
    assert gateway == rabbit
    assert rabbit[3] == (
        "channel",
        406,
        "PRECONDITION_FAILED - message size 1001 is larger than configured max size 1000",
        60,
        40,
    )
    assert rabbit[-1][1]["message_count"] == 1


def test_message_above_the_default_maximum_of_128_mib(servers: list[Server], names: str) -> None:
    """RabbitMQ 3.10's default max_message_size is 128 MiB (mqgw's was 16 MiB)."""
    rabbit, gateway = run_both(servers, _oversized((128 << 20) + 1), names)
    assert gateway == rabbit
    assert rabbit[3][2] == (
        "PRECONDITION_FAILED - message size 134217729 is larger than configured max size 134217728"
    )


def _open(client: RawClient, number: int) -> Any:
    client.send(number, c.Channel.Open())
    return describe(client.next_method(number))


def test_channel_max_counts_open_channels_not_numbers(servers: list[Server], names: str) -> None:
    """channel_max 2: channel 65535 may be the first; a third open one closes the connection
    with rabbit_reader's text; a closed channel no longer counts."""

    def scenario(server: Server, p: str) -> Any:
        seen = []
        with RawClient(server.port, channel_max=2) as client:
            seen += [_open(client, 65535), _open(client, 7)]
            seen.append(describe(client.rpc(7, c.Channel.Close(200, "", 0, 0))))
            seen += [_open(client, 9), _open(client, 2047)]
        return seen

    rabbit, gateway = run_both(servers, scenario, names)
    assert gateway == rabbit
    assert rabbit[:4] == [("Channel.OpenOk", {"channel_id": ""})] * 2 + [
        ("Channel.CloseOk", {}),
        ("Channel.OpenOk", {"channel_id": ""}),
    ]
    assert rabbit[4] == (
        "connection",
        530,
        "NOT_ALLOWED - number of channels opened (2) has reached the negotiated channel_max (2)",
        0,
        0,
    )
