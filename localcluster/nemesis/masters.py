"""Who was master of the broker group, from the brokers' own logs: never two brokers master at one
epoch, each new term at a higher epoch than every term before it began, and never two brokers
confirming at one moment.

A broker logs "broker B is master at epoch E from offset O" when it takes a term and "broker B
stops acting as master (epoch E)" when it leaves it (storage/replication/role.py);
each stretch of confirms opens with "broker B confirms as master at epoch E ..." and closes with
"... confirmed as master at epoch E until T (why)" (storage/replication/confirm_windows.py). A
kill ends a stretch without a line: the run says when it killed which host. Clocks: every host
is this machine, so log times compare.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

LOG_TIME = r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) "  # a log line's time, group 1
BEGINS = re.compile(LOG_TIME + r".*broker (\S+) is master at epoch (\d+) from offset (\d+)")
OPENS = re.compile(LOG_TIME + r".*broker (\S+) confirms as master at epoch (\d+) from offset")
CLOSES = re.compile(
    r".*broker (\S+) confirmed as master at epoch (\d+) until "
    r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})"
)
STAMP = "%Y-%m-%d %H:%M:%S,%f"


@dataclass(frozen=True)
class Term:
    at: datetime
    broker: str
    epoch: int
    offset: int


def terms(lines: Iterable[str]) -> list[Term]:
    found = []
    for line in lines:
        match = BEGINS.match(line)
        if match:
            at = datetime.strptime(match[1], STAMP)
            found.append(Term(at, match[2], int(match[3]), int(match[4])))
    return found


def read_terms(logs: Path) -> list[Term]:
    every: list[Term] = []
    for path in sorted(logs.glob("*-broker.log")):
        every += terms(path.read_text(errors="replace").splitlines())
    return sorted(every, key=lambda t: t.at)


def problems(every: list[Term]) -> list[str]:
    """What breaks the rules, one line each ([] when none)."""
    found = []
    master_of: dict[int, str] = {}
    highest = 0
    for term in every:
        other = master_of.setdefault(term.epoch, term.broker)
        if other != term.broker:
            found.append(f"epoch {term.epoch}: both {other} and {term.broker} were master")
        if term.epoch < highest:
            found.append(
                f"{term.broker} became master at epoch {term.epoch} at {term.at:%H:%M:%S.%f} "
                f"after a term at epoch {highest} had begun"
            )
        highest = max(highest, term.epoch)
    return found


@dataclass(frozen=True)
class Window:
    """A stretch of confirms of one broker process: from its first to its last confirm
    (``end`` None: it was still confirming when the run ended)."""

    host: str
    broker: str
    epoch: int
    start: datetime
    end: datetime | None


def windows(lines: Iterable[str], host: str, kills: Iterable[datetime] = ()) -> list[Window]:
    """The stretches in one broker's log; one its process did not close ends at the first
    kill of ``host`` after it opened."""
    deaths = sorted(kills)
    found: list[Window] = []
    opened: tuple[str, int, datetime] | None = None

    def close(end: datetime | None) -> None:
        if opened is not None:
            found.append(Window(host, opened[0], opened[1], opened[2], end))

    for line in lines:
        if (match := OPENS.match(line)) is not None:
            start = datetime.strptime(match[1], STAMP)
            close(next((d for d in deaths if opened and opened[2] <= d <= start), None))
            opened = (match[2], int(match[3]), start)
        elif (match := CLOSES.match(line)) is not None and opened is not None:
            close(datetime.strptime(match[3], STAMP))
            opened = None
    if opened is not None:
        close(next((d for d in deaths if d >= opened[2]), None))
    return found


def read_windows(logs: Path, kills: dict[str, list[datetime]]) -> list[Window]:
    every: list[Window] = []
    for path in sorted(logs.glob("*-broker.log")):
        host = path.name.removesuffix("-broker.log")
        lines = path.read_text(errors="replace").splitlines()
        every += windows(lines, host, kills.get(host, ()))
    return sorted(every, key=lambda w: w.start)


def overlaps(every: list[Window]) -> list[str]:
    """Two brokers confirming at one moment, one line per pair ([] when none)."""
    found = []
    for i, first in enumerate(every):
        for second in every[i + 1 :]:
            if second.host == first.host:
                continue
            if first.end is None or second.start <= first.end:
                found.append(
                    f"{first.broker} (epoch {first.epoch}, confirming "
                    f"{first.start:%H:%M:%S.%f} to "
                    f"{'the end' if first.end is None else f'{first.end:%H:%M:%S.%f}'}) and "
                    f"{second.broker} (epoch {second.epoch}, from {second.start:%H:%M:%S.%f}) "
                    "confirmed at one time"
                )
    return found
