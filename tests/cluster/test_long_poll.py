"""Long-poll reads with real processes: a message published on gateway B reaches a consumer
on gateway A (which delivers the queue) as soon as the broker has it, not on a poll.

A latency figure, so in the slow tier (`pytest -m slow`); the held reads themselves are
tested without timing in tests/storage/test_broker_waits.py."""

from __future__ import annotations

import time

import pytest

from bench.servers import check_for
from tests.cluster.conftest import Cluster
from tests.cluster.test_two_gateways import channel


@pytest.mark.slow
def test_a_publish_on_the_other_gateway_arrives_at_once(cluster: Cluster) -> None:
    a, b = cluster.add_gateway("gwA"), cluster.add_gateway("gwB")
    conn_a, ch_a = channel(a)
    ch_a.queue_declare("quick")
    latencies: list[float] = []
    ch_a.basic_consume(
        "quick",
        lambda _ch, _m, _p, body: latencies.append(time.monotonic() - float(body)),
        auto_ack=True,
    )
    check_for(10, lambda: "delivering queue 'quick'" in a.log(), interval_s=0.05)
    conn_b, ch_b = channel(b)
    check_for(3, lambda: ch_b.queue_declare("quick", passive=True))
    for n in range(40):
        ch_b.basic_publish("", "quick", str(time.monotonic()).encode())
        # A's events meanwhile (idle gaps now and then: its read is held by then)
        conn_a.process_data_events(time_limit=0.3 if n % 10 == 0 else 0.02)

    def all_in() -> bool:
        conn_a.process_data_events(time_limit=0.05)
        return len(latencies) == 40

    check_for(10, all_in, interval_s=0)
    latencies.sort()
    # A poll every 50 ms gave a median of ~25 ms; held reads answer within a few ms.
    assert latencies[20] < 0.02, latencies
    assert latencies[-1] < 0.5, latencies
    conn_a.close()
    conn_b.close()
