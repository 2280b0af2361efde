"""The stretches in which no controller could decide (localcluster/nemesis/deciding.py)."""

from __future__ import annotations

from datetime import datetime

from localcluster.nemesis.deciding import blind_stretches, longest_within

LOG = """\
2026-11-28 15:37:57,172 INFO mqgw.controller: controller ctl1 started (holder ctl1/ac)
2026-11-28 15:37:57,300 INFO mqgw.controller: controller ctl2 started (holder ctl2/bd)
2026-11-28 15:39:14,635 WARNING mqgw.controller: controller ctl1: Redis unreachable (x): not
2026-11-28 15:39:15,000 WARNING mqgw.controller: controller ctl2: Redis unreachable (x): not
2026-11-28 15:39:18,000 INFO mqgw.controller: controller ctl2: Redis answers again
2026-11-28 15:39:28,073 INFO mqgw.controller: controller ctl1: Redis answers again
2026-11-28 15:40:00,000 WARNING mqgw.controller: controller ctl1: Redis unreachable (x): not
2026-11-28 15:41:00,000 WARNING mqgw.controller: controller ctl2: Redis unreachable (x): not
"""


def at(clock: str) -> datetime:
    return datetime.strptime("2026-11-28 " + clock, "%Y-%m-%d %H:%M:%S,%f")


def test_only_stretches_in_which_every_controller_was_blind_count() -> None:
    lines = LOG.splitlines()[::-1]  # two files, read in any order
    stretches = blind_stretches(lines, 2, end=at("15:41:30,000"))
    # ctl1 alone blind (15:39:18 to 15:39:28, 15:40 to 15:41) does not count: ctl2 decides.
    assert stretches == [
        (at("15:39:15,000"), at("15:39:18,000")),
        (at("15:41:00,000"), at("15:41:30,000")),  # open at the end of the run
    ]
    assert longest_within(stretches, at("15:39:10,000"), at("15:39:16,000")) == 3.0
    assert longest_within(stretches, at("15:39:20,000"), at("15:40:50,000")) == 0.0
