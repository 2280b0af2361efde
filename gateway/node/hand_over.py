"""The node's outbox task: one task stores what queues hand over outside a publish — dead
letters, redelivery backoff retries and the firehose's trace copies — so that a queue never
awaits the store on its delivery path. Queues and vhosts wake it through ``waiting.set``
(each vhost's ``on_dead_letter`` is that bound method, rebound to the new event every round);
housekeeping wakes it again while dead letters are left over (at-least-once retries).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import anyio

from gateway.features.redelivery import Redelivery
from gateway.queues.runtime import QueueRuntime
from gateway.vhost import VirtualHost
from storage import StoredMessage

log = logging.getLogger("mqgw.node")


class HandOver:
    def __init__(self, vhosts: Mapping[str, VirtualHost], redelivery: Redelivery) -> None:
        self._vhosts = vhosts
        self._redelivery = redelivery
        self.waiting = anyio.Event()  # set: something waits to be stored

    def back_off(
        self, vhost: VirtualHost, queue: QueueRuntime, partition: int, message: StoredMessage
    ) -> None:
        """A nack in backoff mode: the redelivery ladder (stored by the outbox task)."""
        self._redelivery.back_off(vhost, queue, partition, message)
        self.waiting.set()

    async def run(self) -> None:
        """One task stores what queues hand over: dead letters, backoff retries and the
        firehose's trace copies."""
        while True:
            await self.waiting.wait()
            self.waiting = anyio.Event()
            try:
                await self._redelivery.flush()
                for vhost in list(self._vhosts.values()):
                    vhost.on_dead_letter = self.waiting.set
                    if vhost.dead_letters:
                        await vhost.flush_dead_letters()
                    if vhost.firehose is not None and vhost.firehose.pending:
                        await vhost.firehose.flush()
            except Exception:
                # A bug here must not take the node down; what was being handed over is lost.
                log.exception("dead-letter / backoff hand-over failed")
