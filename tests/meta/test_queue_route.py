"""Versioned routes of keyed-order queues (meta/queue_route.py): the ranges always cover
every logical partition once, versions are consecutive, QMQ's constraints refuse what they
must with the reason, and a step towards N partitions gets there."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meta.queue_route import (
    QueueRoute,
    RouteRefused,
    closed,
    gate_open,
    initial_route,
    logical_of,
    merge,
    move,
    next_step,
    removed,
    split,
)


def _route(partitions: int = 1, logical: int = 16) -> QueueRoute:
    return initial_route("/", "orders", 7, partitions, logical)


def _complete(route: QueueRoute) -> QueueRoute:
    """Close and drain every partition the last change closed, as the gateway does."""
    for part in route.partitions:
        if part.state == "closing":
            route = closed(route, part.partition, 10 * part.partition)
    for part in route.partitions:
        if part.state == "draining":
            route = removed(route, part.partition)
    return route


def _check(route: QueueRoute) -> None:
    ranges = sorted(route.ranges, key=lambda r: r.start)
    assert ranges[0].start == 0 and ranges[-1].end == route.logical
    for a, b in itertools.pairwise(ranges):
        assert a.end == b.start and a.start < a.end
    holders = [r.partition for r in ranges]
    assert len(holders) == len(set(holders))  # one range per open partition
    assert all(route.partitions[p].state == "open" for p in holders)
    assert [v.version for v in route.versions] == list(range(1, len(route.versions) + 1))


def test_version_one_spreads_the_logical_partitions_evenly() -> None:
    route = _route(4, 1024)
    assert [(r.start, r.end, r.partition) for r in route.ranges] == [
        (0, 256, 0), (256, 512, 1), (512, 768, 2), (768, 1024, 3),
    ]  # fmt: skip
    assert route.version == 1 and route.in_progress() is None


def test_a_key_keeps_its_logical_partition_and_finds_its_new_partition() -> None:
    route = _route(1, 1024)
    key = b"customer-42"
    logical = logical_of(key, 1024)
    assert logical == logical_of(key, 1024)  # stable: crc32, not Python's salted hash
    route = split(route, 0, when="t")
    new = route.partition_of(logical)
    assert new in (1, 2) and route.partitions[0].state == "closing"
    assert route.partitions[new].after == (0,)
    assert not gate_open(route, new)  # until partition 0 drained
    route = removed(closed(route, 0, 5), 0)
    assert gate_open(route, new)


def test_one_change_at_a_time_with_the_reason() -> None:
    route = split(_route(2), 0, when="t")
    reason = r"a change is in progress: version 2 .*partition 0 is closing"
    with pytest.raises(RouteRefused, match=reason):
        split(route, 1)
    route = closed(route, 0, 3)
    with pytest.raises(RouteRefused, match="partition 0 is draining"):
        move(route, 1, "")


def test_only_adjacent_ranges_merge() -> None:
    route = _route(3)  # [0,5) [5,10) [10,16)
    with pytest.raises(RouteRefused, match=r"not contiguous.*only adjacent ranges merge"):
        merge(route, 0, 2)
    merged = merge(route, 2, 1)
    assert [(r.start, r.end) for r in merged.ranges] == [(0, 5), (5, 16)]
    assert merged.partitions[3].after == (1, 2)


def test_unknown_and_closed_partitions_are_refused() -> None:
    route = _route(2)
    with pytest.raises(RouteRefused, match="unknown partition 9"):
        split(route, 9)
    route = _complete(move(route, 0, ""))
    with pytest.raises(RouteRefused, match="partition 0 is removed, not open"):
        split(route, 0)


def test_a_split_point_must_fall_inside_the_range() -> None:
    route = _route(2)  # partition 1: [8, 16)
    with pytest.raises(RouteRefused, match="split point 4 is not inside partition 1"):
        split(route, 1, at=4)
    assert [(r.start, r.end) for r in split(route, 1, at=9).ranges] == [(0, 8), (8, 9), (9, 16)]
    one = initial_route("/", "q", 1, 2, 2)
    with pytest.raises(RouteRefused, match="holds one logical partition"):
        split(one, 0)


OPS = st.lists(
    st.tuples(st.sampled_from(["split", "merge", "move", "target"]), st.integers(0, 40)),
    max_size=25,
)


@settings(max_examples=200, deadline=None)
@given(partitions=st.integers(1, 6), ops=OPS)
def test_every_sequence_of_changes_keeps_the_ranges_whole(
    partitions: int, ops: list[tuple[str, int]]
) -> None:
    route = _route(partitions, 64)
    key_logicals = [logical_of(str(k).encode(), 64) for k in range(50)]
    for op, n in ops:
        open_parts = route.open_partitions()
        p = open_parts[n % len(open_parts)]
        try:
            if op == "split":
                route = split(route, p)
            elif op == "merge":
                ranges = sorted(route.ranges, key=lambda r: r.start)
                i = n % len(ranges)
                other = ranges[i + 1 if i + 1 < len(ranges) else i - 1].partition
                route = merge(route, p if len(ranges) == 1 else ranges[i].partition, other)
            elif op == "move":
                route = move(route, p, "")
            else:
                step = next_step(route, 1 + n % 8)
                if step is not None:
                    kind, parts = step
                    route = split(route, parts[0]) if kind == "split" else merge(route, *parts)
        except RouteRefused:
            continue
        _check(route)
        route = _complete(route)
        _check(route)
        for logical in key_logicals:  # every key has exactly one open partition
            assert route.partitions[route.partition_of(logical)].state == "open"


@pytest.mark.parametrize(("start", "target"), [(1, 4), (4, 8), (8, 2), (3, 3), (5, 1)])
def test_steps_reach_any_count(start: int, target: int) -> None:
    route = _route(start, 1024)
    steps = 0
    while (step := next_step(route, target)) is not None:
        kind, parts = step
        route = _complete(split(route, parts[0]) if kind == "split" else merge(route, *parts))
        steps += 1
    assert len(route.ranges) == target
    assert steps == abs(target - start)
    _check(route)
