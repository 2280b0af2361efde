"""The differential tests against RabbitMQ and the client and queue-feature tests, run again
with every gateway they start storing its messages in a real RocketMQ (MQGW_TEST_ROCKETMQ:
bench/servers.py gives each gateway `--store rocketmq://...`, a namespace per data dir).

Each test passes, or is listed in ``DIFFERS`` with the reason docs/rocketmq.md gives ("What
differs"); a failure not listed fails this test.
"""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.harness.processes import REPO
from tests.harness.rocketmq import local_rocketmq

pytestmark = pytest.mark.slow

SUITES = ["tests/diff", "tests/compat"]
_DISK = (
    "mqgw's own store: disk figures, budget, collector and files (RocketMQ's broker keeps its own)"
)
_LATE = "timing: a message seen a RocketMQ round trip after its publish (open, docs/rocketmq.md)"
DIFFERS = {
    # Timing, not semantics: the scenario acks while publishes are still arriving, and a
    # publish takes a RocketMQ round trip (about 3 ms, not 0.3), so fewer have arrived.
    "tests.diff.test_diff_priority::test_priority_queue_like_rabbitmq[_consumer_order]":
        "which messages have arrived at the first ack depends on the store's latency",
    # Seen failing now and then under a loaded machine, passing on other runs: the order in
    # which a priority queue (or a get right after a publish) sees messages a RocketMQ round
    # trip after they were published. docs/rocketmq.md lists them as open.
    "tests.diff.test_diff_priority::test_priority_queue_like_rabbitmq[_get_order]": _LATE,
    "tests.diff.test_diff_priority::"
    "test_priority_queue_like_rabbitmq[_dead_letters_into_a_priority_queue]": _LATE,
    **{f"tests.diff.test_diff_priority::test_random_sequences_like_rabbitmq[{seed}]": _LATE
       for seed in range(6)},
    "tests.diff.test_diff_single_active::"
    "test_single_active_consumer_like_rabbitmq[_with_priorities]": _LATE,
    "tests.diff.test_diff_delivery::"
    "test_delivery_matches_rabbitmq[server-named-queue-and-last-queue]": _LATE,
    # A publish without confirms, then basic.get on another connection at once: the message
    # is stored a RocketMQ round trip later (AMQP promises nothing there either).
    "tests.compat.test_direct_reply_to::test_rpc_round_trip_through_direct_reply_to":
        "an unconfirmed publish is stored a round trip later",
    "tests.compat.test_large_messages::test_a_100_mib_message_fanned_out_to_three_queues":
        "above RocketMQ's maxMessageSize (32 MiB in `mqgw rocketmq up`): nacked",
    "tests.compat.test_java_client::test_transient_messages_do_not_survive_a_restart":
        "RocketMQ keeps transient messages across a gateway restart",
    "tests.compat.test_restart_redelivered::"
    "test_an_unacked_delivery_comes_back_redelivered_after_kill_9":
        "RocketMQ keeps no crash marks: redelivered=false after a killed lone gateway",
    "tests.compat.test_keyed_order::"
    "test_a_gateway_killed_while_a_split_drains_loses_nothing_and_keeps_order":
        "RocketMQ does not refuse writes after a closing record",
    "tests.compat.test_start_failures::test_a_store_locked_by_another_node": _DISK,
    "tests.compat.test_restart::test_confirmed_messages_survive_a_restart[9]": _DISK,
    "tests.compat.test_delayed_exchange::test_pending_delayed_messages_cost_disk_not_memory":
        _DISK,
    "tests.compat.test_disk_reclaim::"
    "test_draining_empties_the_disk_and_an_unread_queue_keeps_its_messages": _DISK,
    "tests.compat.test_disk_reclaim::test_a_disk_budget_blocks_publishers_and_drops_nothing":
        _DISK,
    "tests.compat.test_disk_reclaim::"
    "test_with_the_collector_a_stuck_message_no_longer_pins_the_log": _DISK,
    "tests.compat.test_full_disk::"
    "test_a_gateway_killed_on_a_full_disk_starts_drains_deletes_and_recovers": _DISK,
    "tests.compat.test_gc_kill::test_collection_killed_at_random_points_loses_nothing[4]":
        _DISK,
    "tests.compat.test_queue_retention::"
    "test_disk_overflow_drop_oldest_keeps_publishers_going_within_the_budget": _DISK,
}  # fmt: skip


def _outcomes(report: Path) -> dict[str, str]:
    found: dict[str, str] = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        failed = case.find("failure") is not None or case.find("error") is not None
        skipped = case.find("skipped") is not None
        found[name] = "failed" if failed else "skipped" if skipped else "passed"
    return found


def test_the_suites_pass_over_rocketmq_or_differ_as_documented(tmp_path: Path) -> None:
    with local_rocketmq(tmp_path / "rmq") as rocketmq:
        report = tmp_path / "report.xml"
        env = {**os.environ, "MQGW_TEST_ROCKETMQ": rocketmq.namesrv}
        subprocess.run(
            [sys.executable, "-m", "pytest", *SUITES, "-q", "-p", "no:cacheprovider",
             f"--junitxml={report}", "--basetemp", str(tmp_path / "runs")],
            cwd=REPO, env=env, timeout=3600, check=False,
        )  # fmt: skip
        outcomes = _outcomes(report)
    assert len(outcomes) > 300  # both suites ran
    failed = {name for name, outcome in outcomes.items() if outcome == "failed"}
    assert failed - set(DIFFERS) == set(), "failed over RocketMQ, not documented"
    # A listed test may pass on a run (timing ones do, some of the time): only said.
    print("listed as different, passed this run:", sorted(set(DIFFERS) - failed))
