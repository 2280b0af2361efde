"""The log lines that bound when a master confirmed: the first confirm of each stretch, and
when the stretch ends (standing ran out, fenced, stepped down) the time of its last confirm.

A checker reads them from every broker's log and finds two brokers confirming at one moment
(localcluster/nemesis/masters.py): what the controller's rules exist to prevent. One line at
each end of a stretch, none per confirm; a kill ends a stretch without its line (the checker
knows when it killed).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

log = logging.getLogger("mqgw.storage.replication")
OPENS = "broker {me} confirms as master at epoch {epoch} from offset {offset}"
CLOSES = "broker {me} confirmed as master at epoch {epoch} until {until} ({why})"


def wall_stamp(seconds: float) -> str:
    """A wall-clock time as log lines print theirs (``2026-11-27 23:37:15,337``)."""
    millis = int(seconds * 1000) % 1000
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(seconds)) + f",{millis:03d}"


class ConfirmWindows:
    def __init__(self, me: str, wall_s: Callable[[], float] = time.time) -> None:
        self.me = me
        self.wall_s = wall_s
        self.epoch = 0
        self.last_s = 0.0  # wall time of the last confirm of the open stretch
        self.open = False

    def confirmed(self, epoch: int, offset: int) -> None:
        if not self.open or epoch != self.epoch:
            self.closed("a new term")
            log.info(OPENS.format(me=self.me, epoch=epoch, offset=offset))
            self.open, self.epoch = True, epoch
        self.last_s = self.wall_s()

    def closed(self, why: str) -> None:
        if self.open:
            self.open = False
            until = wall_stamp(self.last_s)
            log.info(CLOSES.format(me=self.me, epoch=self.epoch, until=until, why=why))
