"""The keyed-order scenarios of `mqgw bench` (keyed-1p/4p/8p): one queue fed through a topic
exchange by 1,000 routing keys as one sequence, four consumers checking what they get, and the
queue declared as each server keeps order: mqgw x-mqgw-ordering over N partitions, RabbitMQ a
single-active-consumer queue. One small run against a real gateway completes with nothing
lost; speed is never asserted."""

from __future__ import annotations

from pathlib import Path

from bench.load.measure import run_scenario
from bench.load.runner import Run, Target
from bench.load.scenarios import SCENARIOS, queue_arguments
from tests.harness.processes import GatewayProcess


def test_plans_and_arguments_of_a_keyed_scenario() -> None:
    scenario = SCENARIOS["keyed-4p"]
    run = Run(scenario, Target("amqp://gw/", "mqgw"), scale=0.01, procs=2)
    (plan,), reaches = run.publish_plans()
    assert len(plan.routes) == 1000 and plan.one_sequence
    assert {exchange for exchange, _ in plan.routes} == {run.topology.exchange}
    assert reaches == [[[0]] * 1000]
    consume, queues = run.consume_plans([1000])
    assert len(consume) == 4 and queues == [[0]] * 4
    assert all(c.expected == (1000,) for c in consume)
    assert queue_arguments(scenario, "mqgw") == {"x-mqgw-ordering": "key", "x-mqgw-partitions": 4}
    assert queue_arguments(scenario, "rabbitmq") == {"x-single-active-consumer": True}
    assert queue_arguments(SCENARIOS["confirm-durable-1k"], "mqgw") == {}


def test_a_keyed_run_on_a_real_gateway_delivers_everything_once(tmp_path: Path) -> None:
    gateway = GatewayProcess(tmp_path / "data").start()
    try:
        target = Target(gateway.url, "mqgw", pid=gateway.pid)
        result = run_scenario(SCENARIOS["keyed-8p"], target, scale=0.02, procs=2)
    finally:
        gateway.stop()
    assert result["complete"] is True, result
    assert (result["messages"], result["lost"], result["duplicated"]) == (2000, 0, 0)
