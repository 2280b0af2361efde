"""The log lines that bound a master's stretches of confirms
(storage/replication/confirm_windows.py), read back by the nemesis checker
(localcluster/nemesis/masters.py): one at the first confirm, one with the last confirm's time
when the stretch ends; a new term closes the old stretch."""

from __future__ import annotations

import logging

import pytest

from localcluster.nemesis.masters import windows
from storage.replication.confirm_windows import ConfirmWindows


def test_a_stretch_opens_at_its_first_confirm_and_closes_with_its_last(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [1_800_000_000.0]
    stretch = ConfirmWindows("b", lambda: now[0])
    caplog.set_level(logging.INFO, "mqgw.storage.replication")
    stretch.closed("stepped down")  # nothing open: no line
    stretch.confirmed(3, 100)
    now[0] += 2.25
    stretch.confirmed(3, 200)  # the same stretch: no line
    now[0] += 5
    stretch.closed("standing ran out")
    stretch.closed("stepped down")  # closed already: no line
    stretch.confirmed(4, 300)
    now[0] += 1
    stretch.confirmed(5, 400)  # a new term: the old stretch closes first
    lines = [record.getMessage() for record in caplog.records]
    assert len(lines) == 5
    assert lines[0] == "broker b confirms as master at epoch 3 from offset 100"
    assert lines[1].startswith("broker b confirmed as master at epoch 3 until ")
    assert lines[1].endswith(",250 (standing ran out)")  # the last confirm, 2.25 s in
    assert lines[3].endswith("(a new term)")
    # The checker reads the same lines back.
    stamped = [f"2026-11-27 20:00:00,000 INFO m: {line}" for line in lines]
    found = windows(stamped, "b")
    assert [(w.epoch, w.end is None) for w in found] == [(3, False), (4, False), (5, True)]
    assert found[0].end is not None and found[0].end.microsecond == 250_000
