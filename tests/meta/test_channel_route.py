"""The rules of a plain queue's route (meta/channel_route.py): read-first growth,
write-first shrink and move, one change at a time, and where a closed channel goes."""

from __future__ import annotations

import pytest

from meta.channel_route import channel_route, grow, move, opened, shrink, successor
from meta.queue_route import QueueRoute, RouteRefused, closed, initial_route, removed


def states(route: QueueRoute) -> list[str]:
    return [p.state for p in route.partitions]


def test_growth_is_read_first_and_opens_in_one_write() -> None:
    route = channel_route("/", "q", 7, 2, ("g1", "g2"))
    assert route.by == "channel" and route.open_partitions() == [0, 1]
    grown = grow(route, 3, ["g2", "g1", "g2"], "t")
    assert states(grown) == ["open", "open", "opening", "opening", "opening"]
    assert grown.open_partitions() == [0, 1]  # nobody writes to them yet
    assert grown.versions[-1].change == "grow to 5" and grown.version == 2
    with pytest.raises(RouteRefused, match="in progress"):
        shrink(grown, 1)
    both = opened(grown, [2, 3, 4])
    assert both.open_partitions() == [0, 1, 2, 3, 4] and both.in_progress() is None
    assert [p.group for p in both.partitions] == ["g1", "g2", "g2", "g1", "g2"]


def test_shrink_is_write_first_and_keeps_the_lowest() -> None:
    route = opened(grow(channel_route("/", "q", 7, 1), 3, []), [1, 2, 3])
    small = shrink(route, 2, "t")
    assert states(small) == ["open", "open", "closing", "closing"]
    assert small.open_partitions() == [0, 1]
    assert small.partitions[2].closed_in == small.version == 3
    drained = removed(closed(small, 2, 40), 2)
    assert states(drained) == ["open", "open", "removed", "closing"]
    assert drained.in_progress() is not None  # partition 3 still to go
    done = removed(closed(drained, 3, 12), 3)
    assert done.in_progress() is None and done.read_partitions() == [0, 1]
    for bad in (0, 4, 5):
        with pytest.raises(RouteRefused, match="a shrink keeps from 1 to 3"):
            shrink(route, bad)


def test_a_move_closes_the_old_partition_when_the_new_one_opens() -> None:
    route = channel_route("/", "q", 7, 2, ("g1", "g1"))
    moving = move(route, [0], "g2", "t")
    assert states(moving) == ["open", "open", "opening"]
    assert moving.partitions[2].after == (0,) and moving.partitions[2].group == "g2"
    assert moving.open_partitions() == [0, 1]  # 0 still takes writes until 2 is read
    moved = opened(moving, [2])
    assert states(moved) == ["closing", "open", "open"]
    assert successor(moved, 0) == 2  # its writes go to the new partition, from every gateway
    assert successor(moved, 5) in moved.open_partitions()
    with pytest.raises(RouteRefused, match="partition 9"):
        move(route, [9], "g2")
    with pytest.raises(RouteRefused, match="not open"):
        move(removed(closed(shrink(route, 1), 1, 3), 1), [1], "g2")


def test_keyed_routes_do_not_take_channel_changes() -> None:
    with pytest.raises(RouteRefused, match="keyed-order"):
        grow(initial_route("/", "k", 1, 2), 1, [])
