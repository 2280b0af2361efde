"""Heartbeat bookkeeping with time passed in (no clock is read here).

RabbitMQ's rabbit_heartbeat sends a heartbeat when nothing was sent for half
the negotiated interval, and declares the peer dead when no byte at all arrived
during two consecutive intervals. Any traffic counts, not only heartbeat frames.
"""

from __future__ import annotations

import enum


class HeartbeatAction(enum.Enum):
    NONE = "none"
    SEND = "send"
    TIMED_OUT = "timed_out"


class HeartbeatMonitor:
    """Tracks send/receive activity; ``check(now)`` says what to do."""

    __slots__ = ("_last_recv_at", "_last_send_at", "interval_s", "received", "sent")

    def __init__(self) -> None:
        self.interval_s = 0  # 0 = heartbeats off
        self.received = False  # input seen since the last check
        self.sent = False  # output queued since the last check
        self._last_recv_at: float | None = None
        self._last_send_at: float | None = None

    def check(self, now: float) -> HeartbeatAction:
        interval = self.interval_s
        if interval <= 0:
            return HeartbeatAction.NONE
        if self._last_recv_at is None or self.received:
            self._last_recv_at = now
            self.received = False
        if self._last_send_at is None or self.sent:
            self._last_send_at = now
            self.sent = False
        if now - self._last_recv_at >= 2 * interval:
            return HeartbeatAction.TIMED_OUT
        if now - self._last_send_at >= interval / 2:
            self._last_send_at = now
            return HeartbeatAction.SEND
        return HeartbeatAction.NONE
