"""Who was master of the broker group, from the brokers' own logs: never two brokers master
at one epoch, and each new term at a higher epoch than every term before it began.

A broker logs "broker B is master at epoch E from offset O" when it takes a term and
"broker B stops acting as master (epoch E)" when it leaves it (storage/replicated_store.py);
a kill ends a term without a line. Clocks: every host is this machine, so log times compare.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

_TIME = r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) "
BEGINS = re.compile(_TIME + r".*broker (\S+) is master at epoch (\d+) from offset (\d+)")


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
            at = datetime.strptime(match[1], "%Y-%m-%d %H:%M:%S,%f")
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
