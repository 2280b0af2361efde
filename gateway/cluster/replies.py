"""Direct reply-to across the gateways of a cluster: the relay task of one gateway.

A reply key names the gateway holding its consumer (gateway/features/direct_reply.py). A
reply published here to another gateway's key is queued by ``forward`` (on the publish
path: no Redis call there); the sender pushes everything queued, one batch per destination,
in one pipeline (meta/reply_relay.py), so the Redis work is per batch, not per message. The
receiver takes the batches pushed to this gateway and delivers each reply to its channel as
the local path does.

Whether a requester is gone is known where it lived: the receiver sends a mandatory reply
whose key is gone back to its publisher's gateway (a bounce), which returns it 312
NO_ROUTE on the publishing channel. A gateway that is gone (its inbox's live key lapsed or
was deleted at its stop) is refused at the push: its mandatory replies are returned here.
Either return comes after the publish was handled, so in confirm mode it may follow the
basic.ack (RabbitMQ sends it first). With Redis away, replies to other gateways are
dropped (mandatory: returned at once); local replies do not use Redis at all.
"""

from __future__ import annotations

import itertools
import logging
import struct
import time
from collections.abc import Iterable
from contextlib import suppress
from typing import Generic

import anyio

from gateway.features.direct_reply import TAG_LENGTH, Channel, DirectReplies
from meta.errors import MetadataUnavailable
from meta.reply_relay import ReplyInboxes

log = logging.getLogger("mqgw.cluster")

REPLY, BOUNCE = 1, 2
# kind, return id (0: not mandatory), lengths of routing key, properties and body
_HEAD = struct.Struct(">BIHII")
BATCH_BYTES = 256 * 1024  # one list element holds about this much (then another one)
LIVE_MS = 5_000  # this gateway's inbox counts as read this long after its last renewal
RENEW_S = 1.0
TAKE_WAIT_S = 1.0  # the blocking read of the inbox (then read again)
RETRY_S = 0.5
RETURN_WAIT_S = 30.0  # a mandatory reply relayed can be bounced back within this

# (kind, return id, routing key, properties, body)
Message = tuple[int, int, str, bytes, bytes | bytearray]


class ReplyRelay(Generic[Channel]):
    """Carries direct replies between this gateway and the others (see the module doc)."""

    def __init__(self, replies: DirectReplies[Channel], inboxes: ReplyInboxes) -> None:
        self.replies = replies
        self.inboxes = inboxes
        self.tag = replies.tag
        self.down = False  # Redis is away: replies to other gateways are refused
        self.relayed = self.received = self.dropped = 0
        self._pending: dict[str, list[Message]] = {}  # destination tag -> its messages
        self._wake = anyio.Event()
        # Mandatory replies relayed, by return id: the publishing channel and when.
        self._returns: dict[int, tuple[Channel, float]] = {}
        self._ids = itertools.count(1)
        replies.relay = self

    def forward(
        self,
        tag: str,
        routing_key: str,
        properties: bytes,
        body: bytes | bytearray,
        returns_to: Channel | None,
    ) -> bool:
        if self.down:
            return False
        return_id = 0
        if returns_to is not None:
            return_id = next(self._ids)
            self._returns[return_id] = (returns_to, time.monotonic())
        self._queue(tag, (REPLY, return_id, routing_key, properties, body))
        return True

    def _queue(self, tag: str, message: Message) -> None:
        pending = self._pending.get(tag)
        if pending is None:
            pending = self._pending[tag] = []
            self._wake.set()
        pending.append(message)

    async def run(self) -> None:
        """Send and receive until cancelled; then replies to this gateway are refused."""
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._send_loop)
                tg.start_soon(self._receive_loop)
        finally:
            # (With Redis away its live key lapses by itself.)
            with anyio.move_on_after(1.0, shield=True), suppress(MetadataUnavailable):
                await self.inboxes.leave(self.tag)

    # -- sending --------------------------------------------------------------------------

    async def _send_loop(self) -> None:
        while True:
            await self._wake.wait()
            self._wake = anyio.Event()
            # What comes in while this batch is on its way forms the next one.
            pending, self._pending = self._pending, {}
            self._forget_old_returns()
            await self._send(pending)

    async def _send(self, pending: dict[str, list[Message]]) -> None:
        batches = {tag: list(_pack(self.tag, messages)) for tag, messages in pending.items()}
        try:
            gone = await self.inboxes.push(batches)
        except MetadataUnavailable as error:
            self._lost(error)
            for messages in pending.values():
                self._drop(messages)
            return
        for tag in gone:
            self._drop(pending[tag])
        self.relayed += sum(len(m) for t, m in pending.items() if t not in gone)

    def _drop(self, messages: Iterable[Message]) -> None:
        """Not relayed: replies are lost, mandatory ones returned to their publisher."""
        for kind, return_id, routing_key, properties, body in messages:
            self.dropped += 1
            if kind == REPLY and return_id:
                self._give_back(return_id, routing_key, properties, body)

    def _give_back(
        self, return_id: int, routing_key: str, properties: bytes, body: bytes | bytearray
    ) -> None:
        entry = self._returns.pop(return_id, None)
        give_back = self.replies.give_back
        if entry is not None and not entry[0].closing and give_back is not None:
            give_back(entry[0], routing_key, properties, body)

    def _forget_old_returns(self) -> None:
        """Mandatory replies that were delivered are never acknowledged: forgotten later."""
        old = time.monotonic() - RETURN_WAIT_S
        for return_id, (_channel, at) in list(self._returns.items()):
            if at >= old:
                break  # in the order they were relayed
            del self._returns[return_id]

    def _lost(self, error: MetadataUnavailable) -> None:
        if not self.down:
            self.down = True
            log.warning("cluster: direct reply-to: %s; replies to requesters on other "
                        "gateways are dropped (mandatory ones returned) until it is back",
                        error)  # fmt: skip

    # -- receiving ------------------------------------------------------------------------

    async def _receive_loop(self) -> None:
        renew_at = 0.0
        while True:
            now = anyio.current_time()
            renew = now >= renew_at
            try:
                batches = await self.inboxes.take(self.tag, TAKE_WAIT_S, LIVE_MS if renew else 0)
            except MetadataUnavailable as error:
                self._lost(error)
                await anyio.sleep(RETRY_S)
                continue
            if renew:
                renew_at = now + RENEW_S
            if self.down:
                self.down = False
                log.warning("cluster: direct reply-to: Redis is back; replies relayed again")
            for batch in batches:
                try:
                    self._absorb(batch)
                except (struct.error, UnicodeDecodeError, IndexError) as error:
                    log.warning("cluster: direct reply-to: a malformed batch dropped (%s)", error)

    def _absorb(self, batch: bytes) -> None:
        """Deliver each relayed reply; bounce the mandatory ones whose requester is gone,
        return those bounced back here."""
        origin = batch[:TAG_LENGTH].decode()
        lookup, deliver = self.replies.lookup, self.replies.deliver
        pos, end, size = TAG_LENGTH, len(batch), _HEAD.size
        while pos < end:
            kind, return_id, key_length, properties_length, body_length = _HEAD.unpack_from(
                batch, pos
            )
            pos += size
            routing_key = batch[pos : pos + key_length].decode()
            pos += key_length
            properties = batch[pos : pos + properties_length]
            pos += properties_length
            body = batch[pos : pos + body_length]
            pos += body_length
            self.received += 1
            if kind == BOUNCE:
                self._give_back(return_id, routing_key, properties, body)
                continue
            target = lookup(routing_key)
            if target is not None and deliver is not None:
                deliver(target[0], target[1], routing_key, properties, body)
            elif return_id:
                self._queue(origin, (BOUNCE, return_id, routing_key, properties, body))


def _pack(origin: str, messages: list[Message]) -> Iterable[bytes]:
    """The messages as batches of about ``BATCH_BYTES``, each starting with ``origin``."""
    parts: list[bytes | bytearray] = [origin.encode()]
    size = 0
    head = _HEAD.pack
    for kind, return_id, routing_key, properties, body in messages:
        key = routing_key.encode()
        parts += (head(kind, return_id, len(key), len(properties), len(body)), key)
        parts += (properties, body)
        size += len(body) + len(properties)
        if size >= BATCH_BYTES:
            yield b"".join(parts)
            parts, size = [origin.encode()], 0
    if len(parts) > 1:
        yield b"".join(parts)
