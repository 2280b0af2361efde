"""The broker side of the contract: standing, in-sync bookkeeping, the common point."""

from __future__ import annotations

import pytest

from meta.groups.contract import (
    ANYONE,
    Grants,
    InSyncTracker,
    Promise,
    Standing,
    common_point,
    stale,
)
from meta.groups.records import GroupRecord

S = frozenset


def test_standing_counts_from_the_send_time_and_only_grows() -> None:
    standing = Standing()
    assert not standing.valid(0)
    standing.grant(sent_ms=1000, master_timeout_ms=1500)
    assert standing.valid(2499) and not standing.valid(2500)
    standing.grant(sent_ms=900, master_timeout_ms=1500)  # an answer overtaken by a later one
    assert standing.until_ms == 2500
    standing.revoke()
    assert not standing.valid(1000)


def test_stale_records_are_older_ones_only() -> None:
    current = GroupRecord("g", epoch=3, version=7)
    assert stale(GroupRecord("g", epoch=3, version=6), current)
    assert stale(GroupRecord("g", epoch=2, version=9), current)
    assert not stale(GroupRecord("g", epoch=3, version=7), current)  # repeated: still counts
    assert not stale(GroupRecord("g", epoch=4, version=1), current)
    assert not stale(current, None)


def test_a_replica_counts_before_it_is_asked_for_and_until_the_record_has_it() -> None:
    tracker = InSyncTracker("a", S("b"))
    tracker.join("c")
    assert tracker.required() == S("bc") and tracker.asked() == S("c")
    tracker.on_record(S("ab"), answered_seq=5)  # not stored yet: still counted, still asked
    assert tracker.required() == S("bc")
    tracker.on_record(S("abc"), answered_seq=6)
    assert tracker.required() == S("bc") and tracker.asked() == S()


def test_a_withdrawn_ask_counts_until_a_heartbeat_without_it_was_answered() -> None:
    tracker = InSyncTracker("a", S())
    tracker.join("c")
    tracker.withdraw("c", next_seq=10)  # heartbeat 10 is the first that does not ask
    assert tracker.asked() == S() and tracker.required() == S("c")
    tracker.on_record(S("a"), answered_seq=9)  # sent before the withdrawal: may still add c
    assert tracker.required() == S("c")
    tracker.on_record(S("a"), answered_seq=10)
    assert tracker.required() == S()


def test_a_withdrawn_ask_that_landed_anyway_stays_until_shrunk() -> None:
    tracker = InSyncTracker("a", S())
    tracker.join("c")
    tracker.withdraw("c", next_seq=10)
    tracker.on_record(S("ac"), answered_seq=11)  # the controller added it first
    assert tracker.required() == S("c") and tracker.stored == S("c")
    tracker.on_record(S("a"), answered_seq=12)  # shrunk through the controller
    assert tracker.required() == S()


def test_review_reports_stored_laggards_withdraws_pending_ones_and_joins_caught_up() -> None:
    tracker = InSyncTracker("a", S("b"), epoch_start=50)
    tracker.join("c")
    acks = {"b": 40, "c": 45, "d": 60, "e": 49}
    kept_up = {"b": 0, "c": 0, "d": 900, "e": 900}
    lagging = tracker.review(acks, kept_up, end=60, confirmed=30, now_ms=1000,
                             lag_timeout_ms=500, next_seq=8)  # fmt: skip
    assert lagging == S("b")
    assert tracker.withdrawing == {"c": 8}
    # d has the whole log as of the epoch's start; e has the confirm offset but not that.
    assert tracker.pending == {"d"}


@pytest.mark.parametrize(
    ("local", "local_end", "master", "master_end", "expected"),
    [
        ([], 0, [(1, 0)], 10, 0),
        ([(1, 0)], 10, [(1, 0)], 10, 10),
        ([(1, 0)], 7, [(1, 0), (2, 10)], 15, 7),  # a slave behind: nothing to cut
        ([(1, 0)], 12, [(1, 0), (2, 10)], 15, 10),  # old master: its unconfirmed tail goes
        ([(1, 0), (2, 5)], 12, [(1, 0), (3, 8)], 20, 5),  # epoch 2 never reached the master
        ([(1, 0), (2, 5)], 9, [(1, 0), (2, 5), (4, 7)], 20, 7),
        ([(3, 0)], 4, [(1, 0), (2, 5)], 9, 0),  # nothing in common
    ],
)
def test_common_point(
    local: list[tuple[int, int]],
    local_end: int,
    master: list[tuple[int, int]],
    master_end: int,
    expected: int,
) -> None:
    assert common_point(local, local_end, master, master_end) == expected


def test_grants_cover_every_required_replica_until_their_promises_run_out() -> None:
    grants = Grants()
    grants.grant("b", echo_ms=1000, master_timeout_ms=1500)
    assert grants.cover(frozenset("b"), 2, 2499) and not grants.cover(frozenset("b"), 2, 2500)
    assert not grants.cover(frozenset("bc"), 2, 1200)  # c promised nothing
    assert not grants.cover(frozenset("b"), 3, 1200)  # too few for min_in_sync
    assert not grants.cover(frozenset(), 1, 1200)  # nobody to promise: no standing
    grants.grant("b", echo_ms=500, master_timeout_ms=1500)  # an older echo changes nothing
    assert grants.cover(frozenset("b"), 2, 2400)
    grants.revoke()
    assert not grants.cover(frozenset("b"), 2, 1200)


def test_a_promise_binds_until_it_runs_out_and_not_to_its_own_master() -> None:
    promise = Promise()
    assert not promise.binds("a", 0)
    promise.make("a", now_ms=100, master_timeout_ms=1500, margin_ms=500)
    assert not promise.binds("a", 150)  # following the same master is no breach
    assert promise.binds("b", 2099) and not promise.binds("b", 2100)
    assert promise.to == ""  # ran out: released
    promise.make(ANYONE, now_ms=0, master_timeout_ms=1500, margin_ms=500)
    assert promise.binds("a", 10)  # made before a crash: binds whoever is named
    promise.release()
    assert not promise.binds("a", 10)
