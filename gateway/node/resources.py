"""The node's resources: the three alarms that block publishers and where its memory goes.

``ResourceWatch`` holds the disk, store-backlog and memory alarms (gateway/resources/alarms.py)
and feeds them a fresh reading when the node asks (once a second from housekeeping, and after
a publish batch that wrote past the next look); telling the connections that publishers are
now (un)blocked is the node's, which holds them. ``memory_breakdown`` is the admin API's
account of the gateway's memory, summed over the connections and queues it is handed.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Collection, Iterable

from gateway.config.settings import GatewaySettings
from gateway.resources import memory
from gateway.resources.alarms import Alarms, ResourceAlarm
from gateway.sessions.session import Session
from gateway.vhost import VirtualHost
from storage import StoreError, StorePort

log = logging.getLogger("mqgw.node")

# Housekeeping looks at the alarms once a second; a publisher may write more than that in
# between, so a publish batch also looks after a quarter segment (at most this) more.
RESOURCE_LOOK_EVERY_BYTES_MAX = 16 << 20


class ResourceWatch:
    """The alarms of one node and the readings that move them."""

    def __init__(self, settings: GatewaySettings, store: StorePort) -> None:
        self._settings = settings
        self._store = store
        # Disk: "on above" a shortfall reading (limit - free), so both alarms read upwards.
        self.disk_alarm = ResourceAlarm("disk", 0)
        backlog = settings.store_backlog_limit_bytes
        self.store_alarm = ResourceAlarm("store backlog", backlog, backlog // 4)
        limit = memory.high_watermark_bytes(
            settings.memory_high_watermark, memory.machine_bytes(), memory.cgroup_limit_bytes()
        )
        self.memory_alarm = ResourceAlarm("memory", limit, int(limit * 0.9))
        self.alarms = Alarms(self.disk_alarm, self.store_alarm, self.memory_alarm)

    async def read(self) -> None:
        """Feed every alarm a fresh reading; log the ones that went on or off."""
        free = shutil.disk_usage(self._settings.data_dir).free
        shortfall = self._settings.min_free_disk_bytes - free
        budget = self._settings.disk_budget_bytes
        backlog: int | None = None
        try:
            if budget is not None:  # over the budget publishers wait; unread data is kept
                shortfall = max(shortfall, await self._store.disk_bytes() - budget)
            backlog = await self._store.backlog_bytes()
        except StoreError:
            pass  # a broker away (cluster): its alarm stays as it was; housekeeping says so
        if self.memory_alarm.blocked:
            memory.give_back()
        resident = memory.resident_bytes()
        limit = self.memory_alarm.on_above
        for alarm, reading, detail in (
            (self.disk_alarm, shortfall, f"{free} bytes free, budget {budget}"),
            (self.store_alarm, backlog, f"{backlog} bytes not yet durable"),
            (self.memory_alarm, resident, f"{resident} bytes resident, limit {limit}"),
        ):
            if reading is None:
                continue
            change = alarm.update(reading)
            if change is True:
                log.warning("%s alarm: %s: blocking publishers", alarm.name, detail)
            elif change is False:
                log.info("%s alarm cleared: %s", alarm.name, detail)
        self.alarms.changed()

    def next_look(self, end_offset: int) -> int:
        """The store offset past which a publish batch ending at ``end_offset`` looks again."""
        step = min(self._settings.segment_size_bytes // 4, RESOURCE_LOOK_EVERY_BYTES_MAX)
        return end_offset + step

    def block_reason(self) -> str:
        if self.disk_alarm.blocked:
            return "low on disk"
        return "low on memory" if self.memory_alarm.blocked else "store is behind"


def memory_breakdown(
    sessions: Collection[Session], vhosts: Iterable[VirtualHost], high_watermark: int
) -> dict[str, int]:
    """Where the gateway's memory goes (bytes; message bodies counted by their size)."""
    output = unacked = unacked_count = buffered = buffered_count = 0
    for session in sessions:
        output += session.pending_bytes + session.sending_bytes
        for channel in session.channels.values():
            unacked_count += len(channel.unacked)
            unacked += sum(len(d.message.body) for d in channel.unacked.values())
    queues = 0
    for vhost in vhosts:
        for queue in vhost.queues.values():
            queues += 1
            buffered_count += queue.held_count()
            buffered += sum(len(m.body) for _, m in queue.held())
    return {
        "resident": memory.resident_bytes(),
        "high_watermark": high_watermark,
        "connection_output_buffers": output,
        "unacked_deliveries": unacked,
        "unacked_delivery_count": unacked_count,
        "queue_read_buffers": buffered,
        "queue_buffered_count": buffered_count,
        "queues": queues,
        "connections": len(sessions),
    }
