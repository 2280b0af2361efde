"""RabbitMQ's disk alarm: while free disk is below the limit, publishers are blocked.

Blocked means: clients that asked for it get connection.blocked, and the gateway stops reading
from connections that have published (so their TCP window closes, as RabbitMQ does), until
space returns and connection.unblocked goes out. Consumers keep draining meanwhile.
"""

from __future__ import annotations

import anyio


class DiskAlarm:
    def __init__(self, limit_bytes: int) -> None:
        self.limit_bytes = limit_bytes
        self.blocked = False
        self._released = anyio.Event()
        self._released.set()

    def update(self, free_bytes: int) -> bool | None:
        """Feed a reading; True when the alarm went on, False when it went off, else None."""
        blocked = free_bytes < self.limit_bytes
        if blocked == self.blocked:
            return None
        self.blocked = blocked
        if blocked:
            self._released = anyio.Event()
        else:
            self._released.set()
        return blocked

    async def wait_released(self) -> None:
        await self._released.wait()
