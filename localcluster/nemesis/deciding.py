"""When no controller could decide: the stretches in which every controller had lost Redis
(its log says "Redis unreachable ... not deciding" until "Redis answers again"). A broker
master lost inside one is not replaced until it ends, so its length around a fault is what
that fault costs in failover capability (a Redis failover, a split that leaves the Redis
master on the smaller side, every Redis host down).

Clocks: every host is this machine, so log times compare with the run's own wall clock.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path

from localcluster.nemesis.masters import LOG_TIME, STAMP

BLIND = re.compile(LOG_TIME + r".*controller (\S+): Redis unreachable")
SEES = re.compile(LOG_TIME + r".*controller (\S+)(?:: Redis answers again| started )")
Stretch = tuple[datetime, datetime]


def blind_stretches(lines: Iterable[str], controllers: int, end: datetime) -> list[Stretch]:
    """From the controllers' log lines (any order): the stretches in which all
    ``controllers`` were blind (one still open at ``end`` ends there)."""
    events: list[tuple[datetime, str, bool]] = []
    for line in lines:
        for pattern, blind in ((BLIND, True), (SEES, False)):
            if (match := pattern.match(line)) is not None:
                events.append((datetime.strptime(match[1], STAMP), match[2], blind))
    events.sort(key=lambda event: event[0])
    blind_now: set[str] = set()
    found: list[Stretch] = []
    since: datetime | None = None
    for at, name, blind in events:
        (blind_now.add if blind else blind_now.discard)(name)
        if len(blind_now) >= controllers and since is None:
            since = at
        elif len(blind_now) < controllers and since is not None:
            found.append((since, at))
            since = None
    if since is not None:
        found.append((since, end))
    return found


def read_stretches(logs: Path, end: datetime) -> list[Stretch]:
    paths = sorted(logs.glob("*-controller.log"))
    lines = [line for path in paths for line in path.read_text(errors="replace").splitlines()]
    return blind_stretches(lines, len(paths), end)


def longest_within(stretches: Iterable[Stretch], start: datetime, end: datetime) -> float:
    """Seconds of the longest blind stretch that overlaps [start, end], counted whole."""
    return max(
        ((b - a).total_seconds() for a, b in stretches if a <= end and b >= start), default=0.0
    )
