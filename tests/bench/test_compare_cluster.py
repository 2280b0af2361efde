"""`mqgw bench compare --with-cluster`: a real cluster (redis, a broker, gateways) against the
embedded node; the load crosses gateways, and nothing is left running afterwards.

Correctness only (both sides measured, the load spread, clean stop); speed is never asserted.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.load.runner import Run, Target
from bench.load.scenarios import SCENARIOS
from bench.load.versus import compare_cluster
from mqgw_cli.main import main


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_publishers_and_consumers_spread_over_urls_round_robin() -> None:
    urls = ("amqp://a/", "amqp://b/")
    run = Run(SCENARIOS["fanout-10"], Target(urls[0], "two", urls=urls), scale=0.001, procs=3)
    publish, _ = run.publish_plans()
    consume, _ = run.consume_plans([5] * 10)
    assert [p.url for p in publish] == ["amqp://a/"]  # one publisher: url[0]
    assert [c.url for c in consume] == ["amqp://b/", "amqp://a/", "amqp://b/"]  # url[(j+1) % 2]
    many = Run(SCENARIOS["many-queues-1k"], Target(urls[0], "two", urls=urls), 0.001, procs=3)
    assert [p.url for p in many.publish_plans()[0]] == ["amqp://a/", "amqp://b/", "amqp://a/"]


def test_one_url_keeps_every_worker_on_it() -> None:
    run = Run(SCENARIOS["fanout-10"], Target("amqp://only/", "one"), scale=0.001, procs=3)
    consume, _ = run.consume_plans([5] * 10)
    assert {p.url for p in run.publish_plans()[0]} | {c.url for c in consume} == {"amqp://only/"}


def test_cluster_against_embedded_spreads_load_and_stops_everything(
    capsys: pytest.CaptureFixture[str],
) -> None:
    scenario = SCENARIOS["confirm-durable-1k"]
    report = compare_cluster([scenario], [2], False, scale=0.005, rounds=1, procs=1)

    (summary,) = report["summaries"]
    assert set(summary["sides"]) == {"cluster-2gw", "embedded"}
    for side in summary["sides"].values():
        assert side["msgs_per_s"]["median"] > 0
        assert (side["lost"], side["duplicated"]) == (0, 0)
    assert summary["ratios"]["cluster-2gw/embedded"]["msgs_per_s"]["median"] > 0

    (row,) = report["rows"]["confirm-durable-1k"]
    cluster_run = row["cluster-2gw"]
    assert cluster_run["complete"] is True
    sent = scenario.count(0.005)
    # The publisher went to gw1, the consumer to gw2: each gateway carried its half.
    assert cluster_run["per_gateway"] == {
        "gw1": {"publish": sent, "deliver": 0},
        "gw2": {"publish": 0, "deliver": sent},
    }

    # Every process of every side is gone (the cluster's run in their own sessions).
    pids = [pid for side in report["sides"] for pid in side["pids"]]
    assert len(pids) == 5  # redis, broker, 2 gateways; the embedded node
    assert report["left_running"] == []
    assert [pid for pid in pids if _running(pid)] == []

    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line]
    assert [r["side"] for r in lines if "side" in r] == ["cluster-2gw", "embedded"]
    assert [r["summary"] for r in lines if "summary" in r] == ["confirm-durable-1k"]


def test_cluster_gateways_without_with_cluster_is_refused() -> None:
    with pytest.raises(SystemExit, match="--cluster-gateways goes with --with-cluster"):
        main(["bench", "compare", "--with-rabbitmq", "--cluster-gateways", "1"])
    with pytest.raises(SystemExit, match="not URLs"):
        main(["bench", "compare", "--with-cluster", "--compare", "amqp://a/", "amqp://b/"])


@pytest.mark.slow
def test_cluster_one_and_two_gateways_against_embedded_and_rabbitmq() -> None:
    names = ("confirm-durable-1k", "transient-autoack", "fanout-10")
    report = compare_cluster(
        [SCENARIOS[n] for n in names], [2, 1], True, scale=0.2, rounds=2, procs=1
    )
    assert report["left_running"] == []
    for summary in report["summaries"]:
        assert summary["errors"] == 0
        assert set(summary["ratios"]) == {
            "cluster-2gw/cluster-1gw",
            "cluster-2gw/embedded",
            "cluster-2gw/rabbitmq",
            "cluster-1gw/embedded",
            "cluster-1gw/rabbitmq",
        }
        for side in summary["sides"].values():
            assert (side["lost"], side["duplicated"]) == (0, 0)
