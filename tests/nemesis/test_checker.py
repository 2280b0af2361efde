"""The nemesis run's checker (localcluster/nemesis/checker.py) finds each kind of failure in
a history made for it, and passes a clean one with unconfirmed losses and flagged repeats."""

from __future__ import annotations

from localcluster.nemesis.checker import Delivered, Published, check
from localcluster.nemesis.run import longest_stall


def _sent(queue: str, publisher: str, seqs: range, confirmed: bool = True) -> list[Published]:
    return [Published(queue, publisher, n, confirmed) for n in seqs]


def _got(queue: str, consumer: str, keys: list[str], redelivered: bool = False) -> list[Delivered]:
    return [Delivered(queue, consumer, key, redelivered) for key in keys]


def test_a_clean_history_passes() -> None:
    published = _sent("q", "p1", range(3)) + _sent("q", "p2", range(1, 2), confirmed=False)
    delivered = _got("q", "c1", ["p1:0", "p1:1", "p1:2"]) + _got("q", "c1", ["p1:1"], True)
    verdict = check(published, delivered, one_partition=["q"])
    assert verdict.ok, verdict.describe()
    assert (verdict.published, verdict.confirmed, verdict.delivered) == (4, 3, 4)
    assert verdict.duplicates == 1
    assert "clean" in verdict.describe()


def test_a_confirmed_message_never_delivered_is_lost() -> None:
    verdict = check(_sent("q", "p1", range(3)), _got("q", "c1", ["p1:0", "p1:2"]))
    assert verdict.lost == ["p1:1 on q"] and not verdict.ok
    assert "lost: 1: p1:1 on q" in verdict.describe()


def test_a_message_never_published_is_unexpected() -> None:
    verdict = check(_sent("q", "p1", range(1)), _got("q", "c1", ["p1:0", "ghost:9"]))
    assert verdict.unexpected == ["ghost:9 on q"] and not verdict.ok


def test_a_repeat_without_the_redelivered_flag_is_reported() -> None:
    verdict = check(
        _sent("q", "p1", range(1)), _got("q", "c1", ["p1:0"]) + _got("q", "c2", ["p1:0"])
    )
    assert verdict.unflagged == ["p1:0 to c2"] and not verdict.ok
    # The flagged copy may come first: n deliveries need n - 1 flags, in any order.
    flagged_first = _got("q", "c2", ["p1:0"], True) + _got("q", "c1", ["p1:0"])
    assert check(_sent("q", "p1", range(1)), flagged_first).ok
    thrice = _got("q", "c1", ["p1:0"]) + _got("q", "c2", ["p1:0"], True) + _got("q", "c1", ["p1:0"])
    assert check(_sent("q", "p1", range(1)), thrice).unflagged == ["p1:0 to c1"]


def test_order_per_channel_on_a_one_partition_queue() -> None:
    published = _sent("q", "p1", range(3)) + _sent("q", "p2", range(2))
    interleaved = _got("q", "c1", ["p2:0", "p1:0", "p2:1", "p1:1", "p1:2"])
    assert check(published, interleaved, one_partition=["q"]).ok  # channels interleave freely
    swapped = _got("q", "c1", ["p1:0", "p1:2", "p1:1"])
    verdict = check(published[:3], swapped, one_partition=["q"])
    assert verdict.out_of_order == ["p1:1 after p1:2 to c1"]
    assert check(published[:3], swapped).ok  # not a one-partition queue: order not promised
    # A publisher that reconnected: a message it gave up on with its first channel may land
    # after the next channel's (the gateway still stored it): not an order broken.
    two_channels = [
        Published("q", "p1", 0, False, 0.0, "p1#1"),
        Published("q", "p1", 1, True, 0.0, "p1#2"),
    ]
    assert check(two_channels, _got("q", "c1", ["p1:1", "p1:0"]), one_partition=["q"]).ok
    # Two consumers: each sees its own subsequence in order.
    split = _got("q", "c1", ["p1:0", "p1:2"]) + _got("q", "c2", ["p1:1"])
    assert check(published[:3], split, one_partition=["q"]).ok


def test_order_per_key_on_a_keyed_queue() -> None:
    """One channel, two order keys: each key's messages in order, the keys interleaved."""
    published = [Published("k", "p1", n, True, 0.0, "p1#1", f"k{n % 2}") for n in range(4)]
    keys_apart = _got("k", "c1", ["p1:1", "p1:3", "p1:0", "p1:2"])
    assert check(published, keys_apart, one_partition=["k"]).ok
    within_a_key = _got("k", "c1", ["p1:2", "p1:0", "p1:1", "p1:3"])
    verdict = check(published, within_a_key, one_partition=["k"])
    assert verdict.out_of_order == ["p1:0 after p1:2 to c1"]


def test_the_longest_confirm_gap_around_a_fault() -> None:
    confirms = [0.0, 1.0, 1.5, 4.5, 5.0, 9.0]
    assert longest_stall(confirms, 2.0, 3.0) == 3.0  # 1.5 -> 4.5 spans the fault
    assert longest_stall(confirms, 4.6, 4.9) == 0.5
    assert longest_stall(confirms, 0.0, 10.0) == 4.0
    assert longest_stall([], 0.0, 1.0) == 0.0
