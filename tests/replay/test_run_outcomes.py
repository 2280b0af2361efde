"""`replay run` end to end on a synthetic trace: keys balanced over the senders, every outcome
recorded (a missing exchange's messages unsent, with the 404), and --resume re-sending only
what was not confirmed."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pika
import pyarrow.parquet as pq
from pyspark.sql import SparkSession

from bench.servers import GatewayServer
from replay.run import RunOptions, run_replay

PUBLISHERS = 8
PER_PUBLISHER = 40


def route(i: int) -> tuple[str, str]:
    if i % 10 == 3:
        return "gone", "q"  # an exchange the target lacks
    if i % 10 == 7:
        return "", "nowhere"  # no such queue: returned
    return "", "q"


def write_trace(path: Path) -> None:
    with path.open("w") as out:
        for i in range(PUBLISHERS * PER_PUBLISHER):
            exchange, key = route(i)
            line = {
                "channel": 1,
                "connection": f"publisher-{i % PUBLISHERS}",
                "exchange": exchange,
                "payload": base64.b64encode(i.to_bytes(4, "big")).decode(),
                "properties": {"headers": {"i": i}},
                "routed_queues": [key],
                "routing_keys": [key],
                "timestamp": f"2026-01-01T00:00:{i // 100:02d}.{i % 100:02d}0+00:00",
                "type": "published",
                "vhost": "/",
            }
            out.write(json.dumps(line) + "\n")


def test_outcomes_balance_and_resume(spark: SparkSession, tmp_path: Path) -> None:
    gateway = GatewayServer(tmp_path / "gw", flush="async").start()
    trace = tmp_path / "t.log"
    write_trace(trace)
    out = tmp_path / "run"
    total = PUBLISHERS * PER_PUBLISHER
    try:
        connection = pika.BlockingConnection(pika.URLParameters(gateway.url))
        connection.channel().queue_declare("q", durable=True)
        connection.close()
        options = RunOptions(trace, "rabbitmq-trace", gateway.url, out, speed=float("inf"))
        options.senders = 2
        first = run_replay(spark, options)
        results = pq.read_table(out / "results.parquet").to_pylist()
        tasks = [json.loads(p.read_text()) for p in (out / "progress").glob("*.json")]
        options.resume = True
        second = run_replay(spark, options)
    finally:
        gateway.stop()
    assert (first.messages, first.sent, first.failures) == (total, total, [])
    assert (first.confirmed, first.returned, first.errors) == (total * 8 // 10, total // 10, 32)
    by_id = {r["capture_id"]: r for r in results}
    assert len(by_id) == len(results) == total
    for number in range(total):
        result = by_id[f"t.log:{number + 1}"]
        exchange, key = route(number)
        if exchange == "gone":
            assert result["outcome"] == "error"
            assert (
                result["reason"]
                == "channel closed: 404 NOT_FOUND - no exchange 'gone' in vhost '/'"
            )
        elif key == "nowhere":
            assert (result["outcome"], result["reason"]) == ("returned", "312 NO_ROUTE")
        else:
            assert result["outcome"] == "confirmed"
        assert result["sent_ms"] >= result["due_ms"]  # never before its time
    # 8 keys of 40 messages on 2 senders: 4 keys, 160 messages each
    assert sorted(t["sent"] for t in tasks) == [total // 2, total // 2]
    # --resume sends again only what was not confirmed: the returned and the failed
    assert second.skipped_confirmed == first.confirmed
    assert second.messages == second.sent == total - first.confirmed
    assert (second.returned, second.errors) == (first.returned, first.errors)
