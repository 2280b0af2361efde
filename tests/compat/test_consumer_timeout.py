"""Per-queue consumer timeout (x-consumer-timeout, as RabbitMQ 3.12+ and vivo's 15 min
default allow; RabbitMQ 3.10 has only the global one, compared in tests/diff): a delivery held
past it closes the channel with 406 and comes back redelivered; other queues keep the node's
default."""

from __future__ import annotations

from pathlib import Path

from pamqp import commands as c

from tests.diff.raw import RawClient, describe_close
from tests.harness.processes import GatewayProcess


def test_queue_consumer_timeout_closes_the_channel_and_requeues(tmp_path: Path) -> None:
    gateway = GatewayProcess(tmp_path / "data").start()
    try:
        with RawClient(gateway.amqp_port) as client:
            for channel in (1, 2, 3):
                client.open_channel(channel)
            client.rpc(1, c.Queue.Declare(queue="strict", arguments={"x-consumer-timeout": 200}))
            client.rpc(1, c.Queue.Declare(queue="relaxed"))
            client.rpc(1, c.Confirm.Select())
            for queue in ("strict", "relaxed"):
                client.publish(1, "", queue, b"held")
                client.next_method(1)
            client.rpc(2, c.Basic.Get(queue="relaxed"))  # the default (30 min) applies
            client.rpc(3, c.Basic.Get(queue="strict"))
            closed = client.next_item(3, timeout_s=5)  # unprompted, once 200 ms have passed
            assert describe_close(closed) == (
                "channel",
                406,
                "PRECONDITION_FAILED - delivery acknowledgement on channel 3 timed out. Timeout "
                "value used: 200 ms. This timeout value can be configured, see consumers doc "
                "guide to learn more",
                0,
                0,
            )
            again = client.rpc(1, c.Basic.Get(queue="strict", no_ack=True))
            assert (again.body, dict(again.method)["redelivered"]) == (b"held", True)
            assert client.drain(2, timeout_s=0.3) == []  # channel 2 still open, no close
    finally:
        gateway.stop()
    assert "was not acknowledged within 200 ms (consumer timeout)" in gateway.log()
