"""Tiny runs of the load scenarios against a real gateway: every message arrives exactly once.

Correctness only (counts, loss, duplicates); timing figures are never asserted.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from bench.load.measure import run_scenario
from bench.load.runner import Target
from bench.load.scenarios import SCENARIOS
from bench.processes import process_tree, tree_cpu_s
from tests.harness.processes import GatewayProcess

SCALE = 0.001  # 200 messages for confirm-durable-100b, 1,000 for backlog-1m


@pytest.mark.parametrize(
    ("name", "deliveries"),
    [
        ("confirm-durable-100b", 200),
        ("ack-each-100b", 200),  # one basic.ack per message
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
    # The gateway's CPU seconds (ticks of 10 ms: a tiny run may read 0), per 100k delivered.
    assert result["cpu_s"] >= 0
    assert result["cpu_s_per_100k"] == round(result["cpu_s"] * 100_000 / deliveries, 3)
    if name == "backlog-1m":
        assert result["publish_first_per_s"] and result["drain_per_s"]
    if name == "slow-consumer":
        assert result["slow_published"] == 10
    if name == "many-queues-1k":
        assert result["min_queue_share"] == 1.0


def test_cpu_seconds_count_the_whole_process_tree() -> None:
    # A child burns 0.3 s of CPU, then waits: its seconds, and its parent's tree's.
    burner = subprocess.Popen(
        [sys.executable, "-c", BURN],
        stdin=subprocess.PIPE,
    )
    try:
        assert burner.pid in process_tree(os.getpid())
        end = time.monotonic() + 10
        while tree_cpu_s(burner.pid) < 0.25 and time.monotonic() < end:
            time.sleep(0.05)
        assert tree_cpu_s(os.getpid()) >= tree_cpu_s(burner.pid) >= 0.25
    finally:
        burner.kill()
        burner.wait()


BURN = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass\ninput()"
