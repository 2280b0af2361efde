"""The nemesis run's check on the brokers' logs (localcluster/nemesis/masters.py): one master
per epoch, epochs rising with time, no two brokers confirming at one moment."""

from __future__ import annotations

from datetime import datetime

from localcluster.nemesis.masters import overlaps, problems, terms, windows

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


STRETCHES = [
    "2026-11-27 20:25:41,000 INFO m: broker 0 confirms as master at epoch 1 from offset 120",
    "2026-11-27 20:25:59,000 WARNING m: broker 0: standing as master ran out at ...",
    "2026-11-27 20:25:59,001 INFO m: broker 0 confirmed as master at epoch 1 until "
    "2026-11-27 20:25:55,500 (standing ran out)",
]
SECOND = [
    "2026-11-27 20:26:02,200 INFO m: broker 1 confirms as master at epoch 2 from offset 812",
]


def test_stretches_of_confirms_never_overlap_between_brokers() -> None:
    first = windows(STRETCHES, "b0")
    assert [(w.broker, w.epoch, w.end) for w in first] == [
        ("0", 1, datetime(2026, 11, 27, 20, 25, 55, 500000))
    ]
    second = windows(SECOND, "b1")
    assert second[0].end is None  # still confirming when the run ended
    assert overlaps(sorted(first + second, key=lambda w: w.start)) == []
    # b0's last confirm after b1's first: two brokers confirmed at one time.
    late = [line.replace("20:25:55,500", "20:26:02,300") for line in STRETCHES]
    (line,) = overlaps(sorted(windows(late, "b0") + second, key=lambda w: w.start))
    assert line.startswith("0 (epoch 1, confirming 20:25:41") and "1 (epoch 2" in line


def test_a_kill_closes_the_stretch_it_left_open() -> None:
    killed = datetime(2026, 11, 27, 20, 25, 50)
    opened = STRETCHES[:1]
    (window,) = windows(opened, "b0", [killed])
    assert window.end == killed
    assert overlaps([window, *windows(SECOND, "b1")]) == []
    (unclosed,) = windows(opened, "b0")  # no kill, no line: it may have gone on confirming
    assert overlaps([unclosed, *windows(SECOND, "b1")]) != []
    # Killed, restarted, confirming again: the first stretch ends at the kill.
    again = [*opened, SECOND[0].replace("broker 1", "broker 0")]
    first, second = windows(again, "b0", [killed])
    assert first.end == killed and second.end is None
