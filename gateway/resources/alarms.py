"""RabbitMQ-style resource alarms: while a resource is short, publishers are blocked.

Blocked means: clients that asked for it get connection.blocked, and the gateway stops reading
from connections that have published (their TCP window closes, as in RabbitMQ) until every
alarm clears and connection.unblocked goes out. Consumers keep draining meanwhile.

Two alarms use this: free disk below `min_free_disk_bytes`, and the store falling behind
(bytes written but not yet durable above `store_backlog_limit_bytes`, clearing below a quarter
of it so that it does not flap).
"""

from __future__ import annotations

import anyio


class ResourceAlarm:
    def __init__(self, name: str, on_above: int, off_below: int | None = None) -> None:
        """On when a reading goes past ``on_above``; off when it falls below ``off_below``."""
        self.name = name
        self.on_above = on_above
        self.off_below = on_above if off_below is None else off_below
        self.blocked = False

    def update(self, reading: int) -> bool | None:
        """Feed a reading; True when the alarm went on, False when it went off, else None."""
        if not self.blocked and reading > self.on_above:
            self.blocked = True
            return True
        if self.blocked and reading < self.off_below:
            self.blocked = False
            return False
        return None


class Alarms:
    """All alarms of a node; publishers wait while any is on."""

    def __init__(self, *alarms: ResourceAlarm) -> None:
        self.alarms = alarms
        self._released = anyio.Event()
        self._released.set()

    @property
    def blocked(self) -> bool:
        return any(a.blocked for a in self.alarms)

    def changed(self) -> None:
        """Call after updates: wakes waiters once nothing blocks any more."""
        if self.blocked:
            if self._released.is_set():
                self._released = anyio.Event()
        else:
            self._released.set()

    async def wait_released(self) -> None:
        await self._released.wait()
