"""The nemesis run's check on the brokers' logs (localcluster/nemesis/masters.py): one master
per epoch, epochs rising with time."""

from __future__ import annotations

from localcluster.nemesis.masters import problems, terms

LOG = [
    "2026-11-27 20:25:40,469 INFO m: broker 0 is master at epoch 1 from offset 0",
    "2026-11-27 20:25:40,515 INFO m: broker 1 follows 0 at epoch 1",
    "2026-11-27 20:26:02,100 INFO m: broker 1 is master at epoch 2 from offset 812",
]


def test_terms_are_read_from_the_log_lines() -> None:
    found = terms(LOG)
    assert [(t.broker, t.epoch, t.offset) for t in found] == [("0", 1, 0), ("1", 2, 812)]
    assert problems(found) == []


def test_two_masters_at_one_epoch_and_an_epoch_going_back_are_reported() -> None:
    twice = terms([*LOG, LOG[2].replace("broker 1 is", "broker 2 is").replace(":02,", ":03,")])
    assert problems(twice) == ["epoch 2: both 1 and 2 were master"]
    back = terms([*LOG, "2026-11-27 20:27:00,000 I x: broker 0 is master at epoch 1 from offset 9"])
    (line,) = problems(back)
    assert line.startswith("0 became master at epoch 1 at 20:27:00") and "epoch 2" in line
