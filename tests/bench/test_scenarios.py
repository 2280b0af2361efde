"""Tiny runs of the load scenarios against a real gateway: every message arrives exactly once.

Correctness only (counts, loss, duplicates); timing figures are never asserted.
"""

from __future__ import annotations

import pytest

from bench.load.measure import run_scenario
from bench.load.runner import Target
from bench.load.scenarios import SCENARIOS
from tests.harness.processes import GatewayProcess

SCALE = 0.001  # 200 messages for confirm-durable-100b, 1,000 for backlog-1m


@pytest.mark.parametrize(
    ("name", "deliveries"),
    [
        ("confirm-durable-100b", 200),
        ("transient-autoack", 500),
        ("fanout-10", 500),  # 50 publishes to 10 queues
        ("many-queues-1k", 100),  # 1,000 queues, most get nothing: shares count only the rest
        ("backlog-1m", 1000),
        ("slow-consumer", 90),  # the slow queue's 10 are reported apart
    ],
)
def test_tiny_scenario_delivers_every_message_once(
    gateway: GatewayProcess, name: str, deliveries: int
) -> None:
    assert gateway.proc is not None
    target = Target(gateway.url, "mqgw", pid=gateway.proc.pid)
    result = run_scenario(SCENARIOS[name], target, scale=SCALE, procs=2)
    assert result["scenario"] == name
    assert result["messages"] == deliveries
    assert (result["lost"], result["duplicated"], result["unexpected"]) == (0, 0, 0)
    assert result["complete"] is True
    assert result["nacked"] == 0
    assert result["rss_end_mb"] > 0
    if name == "backlog-1m":
        assert result["publish_first_per_s"] and result["drain_per_s"]
    if name == "slow-consumer":
        assert result["slow_published"] == 10
    if name == "many-queues-1k":
        assert result["min_queue_share"] == 1.0
