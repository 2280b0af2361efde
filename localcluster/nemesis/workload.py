"""The nemesis run's clients: publishers with confirms (pika on one gateway, aio-pika on the
other) and acking consumers through both gateways, on a plain queue, a single-active-consumer
queue and a keyed-order queue, recording every publish attempt and every delivery for the
checker.

Each publisher is one channel with its own sequence; a message's body is ``<publisher>:<seq>``
and it is published mandatory, so a message that reached no queue comes back as unroutable,
not as a confirm. A publish whose connection died before the confirm counts as unconfirmed.
A consumer records a delivery before it acks it; after a reconnect it is a new consumer (the
per-channel order is a promise per subscription). Clients that lose their gateway try the
other one.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from localcluster.nemesis.checker import Delivered, Published

QUEUES: dict[str, dict[str, Any]] = {
    "nemesis-plain": {},
    "nemesis-sac": {"x-single-active-consumer": True},
    # Two physical partitions (each gateway may deliver one), order per key (docs/ordering.md).
    "nemesis-keyed": {
        "x-mqgw-ordering": "key",
        "x-mqgw-ordering-header": "k",
        "x-mqgw-partitions": 2,
        "x-mqgw-logical-partitions": 16,
    },
}
KEYS = 4  # order keys per publisher (header "k"), the message's sequence number modulo this
PUBLISH_GAP_S = 0.02  # about 50 messages a second per publisher
RECONNECT_S = 0.5
CONFIRM_TIMEOUT_S = 30.0  # aio-pika: a confirm not back by then counts as unconfirmed


def order_key(seq: int) -> str:
    return f"k{seq % KEYS}"


def pika_module() -> Any:
    try:
        import pika  # noqa: PLC0415 (a test extra, needed by this tool only)
    except ImportError as error:  # a test extra: `pip install -e .[test]`
        raise RuntimeError("the nemesis workload needs pika (pip install -e '.[test]')") from error
    return pika


class History:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.published: list[Published] = []
        self.delivered: list[Delivered] = []
        self.errors: list[str] = []

    def sent(self, item: Published) -> None:
        with self.lock:
            self.published.append(item)

    def got(self, item: Delivered) -> None:
        with self.lock:
            self.delivered.append(item)

    def error(self, text: str) -> None:
        with self.lock:
            self.errors.append(text)


class Client(threading.Thread):
    def __init__(self, name: str, urls: Sequence[str], queue: str, history: History) -> None:
        super().__init__(daemon=True, name=name)
        self.urls = list(urls)  # its own gateway first
        self.queue = queue
        self.history = history
        self.stop = threading.Event()

    def connect(self, attempt: int) -> Any:
        pika = pika_module()
        return pika.BlockingConnection(pika.URLParameters(self.urls[attempt % len(self.urls)]))

    def run(self) -> None:
        attempt = 0
        pika = pika_module()
        while not self.stop.is_set():
            try:
                self.session(self.connect(attempt))
            except (pika.exceptions.AMQPError, OSError) as error:
                self.history.error(f"{self.name}: {type(error).__name__}: {error}")
                attempt += 1
                self.stop.wait(RECONNECT_S)

    def session(self, connection: Any) -> None:
        raise NotImplementedError


class Publisher(Client):
    def __init__(self, name: str, urls: Sequence[str], queue: str, history: History) -> None:
        super().__init__(name, urls, queue, history)
        self.seq = 0
        self.incarnation = 0

    def sent(self, seq: int, confirmed: bool, channel: str, key: str) -> None:
        at = time.monotonic()
        self.history.sent(Published(self.queue, self.name, seq, confirmed, at, channel, key))

    def session(self, connection: Any) -> None:
        pika = pika_module()
        self.incarnation += 1
        channel_name = f"{self.name}#{self.incarnation}"
        try:
            channel = connection.channel()
            channel.confirm_delivery()
            while not self.stop.is_set():
                seq, self.seq = self.seq, self.seq + 1
                key = order_key(seq)
                properties = pika.BasicProperties(delivery_mode=2, headers={"k": key})
                confirmed = False
                try:
                    channel.basic_publish("", self.queue, f"{self.name}:{seq}".encode(),
                                          properties, mandatory=True)  # fmt: skip
                    confirmed = True
                except (pika.exceptions.NackError, pika.exceptions.UnroutableError):
                    pass
                finally:
                    self.sent(seq, confirmed, channel_name, key)
                self.stop.wait(PUBLISH_GAP_S)
        finally:
            if connection.is_open:
                connection.close()


class AioPublisher(Publisher):
    """A publisher as an asyncio application writes it: aio-pika, confirms and mandatory on
    the channel, one awaited publish at a time (the same history as ``Publisher``)."""

    def run(self) -> None:
        asyncio.run(self._run())

    async def _run(self) -> None:
        import aio_pika  # noqa: PLC0415 (a test extra, needed by this tool only)

        attempt = 0
        while not self.stop.is_set():
            url = self.urls[attempt % len(self.urls)]
            try:
                connection = await aio_pika.connect(url, timeout=10)
                try:
                    await self._session(aio_pika, connection)
                finally:
                    await connection.close()
            except (aio_pika.exceptions.AMQPError, OSError, TimeoutError) as error:
                self.history.error(f"{self.name}: {type(error).__name__}: {error}")
                attempt += 1
                await asyncio.sleep(RECONNECT_S)

    async def _session(self, aio_pika: Any, connection: Any) -> None:
        self.incarnation += 1
        channel_name = f"{self.name}#{self.incarnation}"
        channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
        refused = (aio_pika.exceptions.DeliveryError, aio_pika.exceptions.PublishError)
        while not self.stop.is_set():
            seq, self.seq = self.seq, self.seq + 1
            key = order_key(seq)
            message = aio_pika.Message(
                f"{self.name}:{seq}".encode(),
                delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                headers={"k": key},
            )
            confirmed = False
            try:
                await channel.default_exchange.publish(
                    message, self.queue, mandatory=True, timeout=CONFIRM_TIMEOUT_S
                )
                confirmed = True
            except refused:
                pass
            finally:
                self.sent(seq, confirmed, channel_name, key)
            await asyncio.sleep(PUBLISH_GAP_S)


class Consumer(Client):
    def __init__(self, name: str, urls: Sequence[str], queue: str, history: History) -> None:
        super().__init__(name, urls, queue, history)
        self.incarnation = 0
        self.last_delivery = time.monotonic()

    def session(self, connection: Any) -> None:
        self.incarnation += 1
        tag = f"{self.name}#{self.incarnation}"
        try:
            channel = connection.channel()
            channel.basic_qos(prefetch_count=50)
            for method, _props, body in channel.consume(self.queue, inactivity_timeout=0.5):
                if self.stop.is_set():
                    break
                if method is None:
                    continue
                self.last_delivery = time.monotonic()
                self.history.got(
                    Delivered(self.queue, tag, body.decode(), method.redelivered, time.monotonic())
                )
                channel.basic_ack(method.delivery_tag)
        finally:
            if connection.is_open:
                connection.close()


class Workload:
    def __init__(self, urls: dict[str, str], history: History | None = None) -> None:
        self.urls = urls  # gateway -> AMQP URL
        self.history = history or History()
        self.publishers: list[Publisher] = []
        self.consumers: list[Consumer] = []

    def declare(self, retry_for_s: float = 30.0) -> None:
        pika = pika_module()
        deadline = time.monotonic() + retry_for_s
        url = next(iter(self.urls.values()))
        while True:
            try:
                with pika.BlockingConnection(pika.URLParameters(url)) as connection:
                    channel = connection.channel()
                    for queue, arguments in QUEUES.items():
                        channel.queue_declare(queue, durable=True, arguments=arguments)
                return
            except pika.exceptions.AMQPError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(RECONNECT_S)

    def _order(self, first: str) -> list[str]:
        return [self.urls[first], *(u for g, u in self.urls.items() if g != first)]

    def start(self) -> None:
        for index, gateway in enumerate(self.urls):
            kind = Publisher if index % 2 == 0 else AioPublisher
            for queue in QUEUES:
                short = queue.removeprefix("nemesis-")
                self.consumers.append(
                    Consumer(f"c-{gateway}-{short}", self._order(gateway), queue, self.history)
                )
                self.publishers.append(
                    kind(f"p-{gateway}-{short}", self._order(gateway), queue, self.history)
                )
        for client in [*self.consumers, *self.publishers]:
            client.start()

    def stop_publishing(self) -> None:
        _stop_all(self.publishers)

    def drain(self, ready: Callable[[], int | None], quiet_s: float, timeout_s: float) -> bool:
        """Let the consumers take everything: True once ``ready()`` (messages left in the
        queues, None when it cannot tell) is 0 and no delivery came for ``quiet_s``."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            last = max(c.last_delivery for c in self.consumers)
            if time.monotonic() - last >= quiet_s and ready() == 0:
                _stop_all(self.consumers)
                return True
            time.sleep(0.2)
        _stop_all(self.consumers)
        return False


def _stop_all(clients: Sequence[Client]) -> None:
    for client in clients:
        client.stop.set()
    for client in clients:
        client.join(15)
