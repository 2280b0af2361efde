"""A queue's length limits (``x-max-length``, ``x-max-length-bytes``) and what overflowing
them does (``x-overflow``), as RabbitMQ 3.10 does it:

- ``drop-head`` (the default): the message is taken, then the oldest ready messages leave
  from the head (dead-lettered as ``maxlen``) until the queue fits again (``enforce``);
- ``reject-publish`` / ``reject-publish-dlx``: a message that would pass a limit is refused
  (``QueueRuntime.would_overflow``, asked per publish), with ``-dlx`` dead-lettered too
  (gateway/queues/dead_lettering.py). A shared broker counts other gateways' publishes this
  gateway never sees, so the limits of such a queue travel with the appends
  (``send_append_limit``) and the broker refuses what would pass them.

The counts they compare (``ready_count``, ``ready_bytes``) are the runtime's, kept exact per
message; nothing here runs per message.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gateway.queues.runtime import QueueRuntime


class LengthLimits:
    """What the queue does about its limits beyond the per-publish check."""

    def __init__(self, queue: QueueRuntime) -> None:
        self.queue = queue
        # The append limits the store was last given: (max-length, max-length-bytes).
        self._limit_sent: tuple[int | None, int | None] = (None, None)

    def send_append_limit(self) -> None:
        """x-max-length(-bytes) reject-publish travels with appends to a shared broker,
        which refuses what would pass it (the embedded store leaves it to would_overflow)."""
        queue = self.queue
        b = queue.behaviour
        limits = (b.max_length, b.max_length_bytes) if b.rejects_publish else (None, None)
        if limits != self._limit_sent:
            self._limit_sent = limits
            queue.store.set_append_limit(queue.queue_id, *limits)

    async def enforce(self) -> None:
        """drop-head: while over max-length or max-length-bytes, the oldest messages go."""
        queue = self.queue
        if queue.behaviour.overflow != "drop-head":
            return
        while queue.over_limit():
            if await queue._fetch_head(always=True) is None:
                return
            taken = queue._pop_head()
            assert taken is not None
            queue.leave(taken[0], taken[1], "maxlen")
