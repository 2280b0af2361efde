"""Clients for the throttle tests: raw AMQP sockets (a client library would spend the CPU the
gateways need at 20,000 msgs/s on two cores), each counting what it got over time.

``CountingConsumer``: an auto-ack consumer of one queue; ``ConsumerProcess``: the same in a
process of its own (six consumers at 20,000 msgs/s are more than one process's GIL can parse
beside the test); ``ConfirmPublisher``: a publisher in confirm mode keeping ``window``
publishes unconfirmed. All keep (monotonic time, count) samples, so a test reads the rate over
any window after the fact. CLOCK_MONOTONIC is one clock for every process of the machine."""

from __future__ import annotations

import bisect
import contextlib
import subprocess
import sys
import threading
import time
from collections.abc import Sequence

from pamqp import commands

from bench.load.connection import RawConnection
from bench.load.frames import PublishTemplate, encode
from bench.servers import GatewayServer


class _Sampled(threading.Thread):
    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.times: list[float] = [time.monotonic()]
        self.counts: list[int] = [0]
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def _sample(self, count: int) -> None:
        self.times.append(time.monotonic())
        self.counts.append(count)

    def count_at(self, at: float) -> int:
        """How many by monotonic time ``at``."""
        index = bisect.bisect_right(self.times, at) - 1
        return self.counts[max(0, index)]

    def close(self) -> None:
        self.stop.set()
        self.join(5)


class CountingConsumer(_Sampled):
    def __init__(self, gateway: GatewayServer | str, queue: str, tag: str = "counter") -> None:
        super().__init__()
        self.conn = RawConnection(gateway if isinstance(gateway, str) else gateway.url)
        self.conn.open_channel(1)
        consume = commands.Basic.Consume(0, queue, tag, no_ack=True)
        self.conn.call(1, consume, commands.Basic.ConsumeOk)
        self.got = 0

    def run(self) -> None:
        self.conn.sock.settimeout(0.1)
        parser = self.conn.parser
        try:
            while not self.stop.is_set():
                with contextlib.suppress(TimeoutError):
                    self.conn.receive()
                self.got += len(parser.deliveries)
                parser.deliveries.clear()
                parser.others.clear()
                self._sample(self.got)
        except (ConnectionError, OSError) as error:  # the gateway was killed: counts stay
            self.error = error
        finally:
            self.conn.sock.close()


class ConsumerProcess(_Sampled):
    """A ``CountingConsumer`` in a child process, which prints its samples; this thread reads
    them. Consuming once ``start`` returns."""

    def __init__(self, gateway: GatewayServer, queue: str, tag: str = "counter") -> None:
        super().__init__()
        command = [sys.executable, "-m", "tests.cluster.throttle_clients", gateway.url, queue, tag]
        self.child = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
        assert self.child.stdout is not None
        ready = self.child.stdout.readline()  # after its consume-ok
        assert ready.strip() == "consuming", f"consumer of {queue} did not start: {ready!r}"

    def run(self) -> None:
        assert self.child.stdout is not None
        for line in self.child.stdout:
            at, count = line.split()
            self.times.append(float(at))
            self.counts.append(int(count))

    def close(self) -> None:
        self.child.terminate()
        self.child.wait(5)
        self.join(5)


def _consume_and_print(url: str, queue: str, tag: str) -> None:
    """The child of ``ConsumerProcess``: samples on stdout every 0.1 s until terminated."""
    consumer = CountingConsumer(url, queue, tag)
    print("consuming", flush=True)
    consumer.start()
    while consumer.is_alive():
        time.sleep(0.1)
        print(consumer.times[-1], consumer.counts[-1], flush=True)


class ConfirmPublisher(_Sampled):
    """Publishes ``body_bytes`` messages to ``queue`` (default exchange) as fast as confirms
    allow, ``window`` at most unconfirmed; counts confirms and nacks."""

    def __init__(
        self, gateway: GatewayServer, queue: str, body_bytes: int = 64, window: int = 200
    ) -> None:
        super().__init__()
        self.conn = RawConnection(gateway.url)
        self.conn.open_channel(1)
        self.conn.call(1, commands.Confirm.Select(), commands.Confirm.SelectOk)
        self.template = PublishTemplate.build(1, "", queue, body_bytes, persistent=False)
        self.window = window
        self.sent = 0
        self.confirmed = 0
        self.nacked = 0

    def run(self) -> None:
        self.conn.sock.settimeout(0.1)
        parser = self.conn.parser
        batch = 20
        try:
            while not self.stop.is_set():
                if self.sent - self.confirmed + batch <= self.window:
                    data = b"".join(self.template.render(self.sent + i, 0) for i in range(batch))
                    self.conn.send(data)
                    self.sent += batch
                    continue
                with contextlib.suppress(TimeoutError):
                    self.conn.receive()
                for _channel, tag, multiple, nack in parser.confirms:
                    # The gateway confirms in order: a multiple ack settles up to its tag.
                    done = max(0, tag - self.confirmed) if multiple else 1
                    self.confirmed += done
                    self.nacked += done if nack else 0
                parser.confirms.clear()
                parser.others.clear()
                self._sample(self.confirmed)
        except (ConnectionError, OSError) as error:
            self.error = error
        finally:
            with contextlib.suppress(OSError):
                self.conn.send(encode(commands.Connection.Close(200, "done", 0, 0), 0))
            self.conn.sock.close()


def total_rate(clients: Sequence[_Sampled], start: float, end: float) -> float:
    """Messages per second over [start, end], summed over ``clients``."""
    got = sum(c.count_at(end) - c.count_at(start) for c in clients)
    return got / (end - start)


if __name__ == "__main__":
    _consume_and_print(*sys.argv[1:4])
