"""Scaling and moving a plain queue on a cluster (redis-server, broker groups g1 and g2, two
`mqgw serve --meta` gateways; docs/elastic-queues.md): pika publishers with confirms on both
gateways, a consumer on each, while operators take the queue 1 → 6 partitions (spread over
both groups, opened once the delivering gateway reads them), move one to the other group and
go down to 2. Every confirmed message arrives (a redelivery flagged as such at most), each
channel's messages published after the changes in order; the closed partitions drain and are
removed. A publisher on the gateway that did not make a change learns of it from the broker,
which refuses appends after a command record."""

from __future__ import annotations

import signal
import threading
import time
from typing import Any

import pika
import pytest

from bench.servers import GatewayServer, check_for
from tests.cluster.conftest import TwoGroups
from tests.harness.confirming_clients import AckingConsumer, ChannelPublishers

CHANNELS = 3


def change(gateway: GatewayServer, what: str, body: dict[str, Any]) -> dict[str, Any]:
    started = time.monotonic()
    status, answer = gateway.admin("POST", f"/api/queues/%2F/elastic/{what}",
                                   {**body, "wait": True, "timeout": 60})  # fmt: skip
    assert status == 200 and answer["complete"] is True, (status, answer)
    print(f"{what} {body} under load: complete in {time.monotonic() - started:.2f} s")
    return dict(answer["route"])


def test_a_plain_queue_scales_and_moves_across_groups_under_load(two_groups: TwoGroups) -> None:
    gw_a, gw_b = two_groups.gateways
    with pika.BlockingConnection(pika.URLParameters(gw_a.url)) as conn:
        conn.channel().queue_declare("elastic", durable=True)
    consumers = [AckingConsumer(gw_a.url, "elastic"), AckingConsumer(gw_b.url, "elastic")]
    publishers = [
        ChannelPublishers(gw_a.url, "elastic", "a"),
        ChannelPublishers(gw_b.url, "elastic", "b"),
    ]
    for worker in (*consumers, *publishers):
        worker.start()
    check_for(10, lambda: all(len(p.confirmed) > 150 for p in publishers))

    route = change(gw_a, "scale", {"partitions": 6})
    groups = [p["group"] for p in route["partitions"]]
    assert [p["state"] for p in route["partitions"]] == ["open"] * 6
    assert sorted(groups) == ["g1"] * 3 + ["g2"] * 3, groups  # spread over the live groups
    assert two_groups.route("elastic") == groups
    moved_from = groups[0]
    to = "g2" if moved_from == "g1" else "g1"
    route = change(gw_b, "move", {"partition": 0, "to": to})
    assert route["partitions"][0]["state"] == "removed"
    assert route["partitions"][6]["group"] == to and route["partitions"][6]["state"] == "open"
    route = change(gw_b, "scale", {"partitions": 2})
    states = [p["state"] for p in route["partitions"]]
    assert states.count("open") == 2 and states.count("removed") == 5, states
    marks = [len(p.confirmed) for p in publishers]  # published after every change
    pairs = list(zip(publishers, marks, strict=True))
    check_for(10, lambda: all(len(p.confirmed) > m + 300 for p, m in pairs))
    for publisher in publishers:
        publisher.stop.set()
        publisher.join(10)
    confirmed = {b for p in publishers for b in p.confirmed}
    check_for(30, lambda: confirmed <= {b for c in consumers for b, _ in c.received})
    for consumer in consumers:
        consumer.stop.set()
        consumer.join(10)

    assert sum(p.nacked for p in publishers) == 0
    arrivals = [item for c in consumers for item in c.received]
    bodies = [b for b, _ in arrivals]
    assert set(bodies) == confirmed  # none lost, nothing unknown
    first_seen: set[bytes] = set()
    for body, redelivered in arrivals:
        assert body not in first_seen or redelivered, f"{body!r} twice, not flagged"
        first_seen.add(body)
    for publisher, mark in pairs:
        after = set(publisher.confirmed[mark:])
        for consumer in consumers:
            for c in range(CHANNELS):
                prefix = f"{publisher.tag}{c}:".encode()
                seen = [int(b.split(b":")[1]) for b, again in consumer.received
                        if b in after and b.startswith(prefix) and not again]  # fmt: skip
                assert seen == sorted(seen), f"channel {publisher.tag}{c} out of order"
    check_for(10, lambda: gw_a.admin("GET", "/api/queues/%2F/elastic")[1]["messages"] == 0)
    _, queue = gw_a.admin("GET", "/api/queues/%2F/elastic")
    ends = {p["partition"]: p["max_offset"] for p in queue["mqgw"]["partition_details"]}
    for part in route["partitions"]:  # nothing written after a command record
        if part["state"] == "removed":
            assert ends[part["partition"]] == part["closed_at"] + 1, (part, ends)


def test_autoscale_on_the_delivering_gateway(two_groups: TwoGroups) -> None:
    """Published through gwA, consumed slowly through gwB: gwB delivers the queue, so it
    decides; it grows by the broker's depth and shrinks once the consumer caught up."""
    gw_a, gw_b = two_groups.gateways
    auto_queue(gw_a, 400)
    slow = AckingConsumer(gw_b.url, "auto", delay_s=0.01)
    slow.start()

    check_for(20, lambda: autoscale(gw_b)["open_partitions"] >= 2)
    assert autoscale(gw_b)["deciding_here"] and not autoscale(gw_a)["deciding_here"]
    check_for(30, lambda: len(slow.received) >= 400)
    check_for(30, lambda: autoscale(gw_b)["open_partitions"] == 1)
    decisions = autoscale(gw_b)["decisions"]
    assert decisions[0]["to"] == 2 and decisions[-1]["to"] == 1, decisions
    assert all(abs(d["to"] - d["from"]) == 1 for d in decisions)  # one step at a time
    slow.stop.set()
    slow.join(10)
    assert sorted({b for b, _ in slow.received}, key=int) == [b"%d" % n for n in range(400)]


def auto_queue(gateway: GatewayServer, count: int, properties: Any = None) -> None:
    """Queue "auto" under an autoscale policy (1 to 3 partitions, depth 50, window 1 s),
    with ``count`` confirmed messages "0", "1", ... in it."""
    policy = {"pattern": "^auto$", "definition": {
        "autoscale": {"min": 1, "max": 3, "depth": 50, "window_s": 1}}}  # fmt: skip
    assert gateway.admin("PUT", "/api/policies/%2F/auto", policy)[0] in (201, 204)
    with pika.BlockingConnection(pika.URLParameters(gateway.url)) as conn:
        channel = conn.channel()
        channel.queue_declare("auto", durable=True)
        channel.confirm_delivery()
        for n in range(count):
            channel.basic_publish("", "auto", b"%d" % n, properties)


def autoscale(gateway: GatewayServer) -> dict[str, Any]:
    """Queue "auto"'s autoscale view as ``gateway`` shows it."""
    status, queue = gateway.admin("GET", "/api/queues/%2F/auto")
    assert status == 200
    view: dict[str, Any] = queue["mqgw"]["autoscale"]
    return view


def _settled_on(gateway: GatewayServer, timeout_s: float = 60) -> dict[str, Any]:
    began = time.monotonic()
    route: dict[str, Any] = {}
    while time.monotonic() - began < timeout_s:
        status, route = gateway.admin("GET", "/api/queues/%2F/elastic/route")
        if status == 200 and route["in_progress"] is None:
            return route
        if status == 400 and "never scaled" in route["reason"]:
            return {"version": 0, "partitions": []}  # a kill before the first change began
        time.sleep(0.1)
    raise AssertionError(f"not settled in {timeout_s:g} s: {route}")


def _version_on(gateway: GatewayServer) -> int | None:
    """The route version a gateway serves (None: the queue was never scaled there)."""
    status, route = gateway.admin("GET", "/api/queues/%2F/elastic/route")
    return int(route["version"]) if status == 200 else None


@pytest.mark.slow
def test_a_gateway_killed_in_the_middle_of_each_change(two_groups: TwoGroups) -> None:
    """gwA is asked for a grow, a move, a shrink, each time killed -9 a moment later
    (before, during or after the change): gwB completes what began (opens what was read,
    appends the command records left unwritten), gwA comes back on the newest version, and
    every message gwB's publisher had confirmed arrives."""
    gw_a, gw_b = two_groups.gateways
    with pika.BlockingConnection(pika.URLParameters(gw_b.url)) as conn:
        conn.channel().queue_declare("elastic", durable=True)
    consumer = AckingConsumer(gw_b.url, "elastic")
    publisher = ChannelPublishers(gw_b.url, "elastic", "b")
    consumer.start()
    publisher.start()
    check_for(10, lambda: len(publisher.confirmed) > 150)
    status, _ = gw_b.admin("POST", "/api/queues/%2F/elastic/scale", {"partitions": 2, "wait": True})
    assert status == 200
    steps = [("scale", {"partitions": 6}, 0.03), ("move", {"partition": 0, "to": "g2"}, 0.02),
             ("scale", {"partitions": 2}, 0.03)]  # fmt: skip
    for what, body, after_s in steps:
        before = _settled_on(gw_b)["version"]
        path = f"/api/queues/%2F/elastic/{what}"
        asked = threading.Thread(target=gw_a.admin, args=("POST", path, body))
        asked.start()
        time.sleep(after_s)  # the kill lands before, in or after the change: all must hold
        gw_a.stop(signal.SIGKILL)
        asked.join()
        began = time.monotonic()
        route = _settled_on(gw_b)
        print(
            f"{what} {body}: gwA killed, version {route['version']} (was {before}) "
            f"settled on gwB in {time.monotonic() - began:.2f} s"
        )
        assert all(p["state"] in ("open", "removed") for p in route["partitions"])
        gw_a.start()  # from this (main) thread: it dies with its starter
        newest = route["version"]
        check_for(30, lambda v=newest: _version_on(gw_a) in (v, None))
    mark = len(publisher.confirmed)
    check_for(10, lambda: len(publisher.confirmed) > mark + 200)
    publisher.stop.set()
    publisher.join(10)
    confirmed = set(publisher.confirmed)
    check_for(30, lambda: confirmed <= {b for b, _ in consumer.received})
    consumer.stop.set()
    consumer.join(10)
    assert publisher.nacked == 0
    _, queue = gw_b.admin("GET", "/api/queues/%2F/elastic")
    ends = {p["partition"]: p["max_offset"] for p in queue["mqgw"]["partition_details"]}
    for part in _settled_on(gw_b)["partitions"]:
        if part["state"] == "removed":  # nothing written after a command record
            assert ends[part["partition"]] == part["closed_at"] + 1, (part, ends)


@pytest.mark.slow
# gwB's consumer thread ends with a connection error when gwB is killed: expected here.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_autoscale_goes_on_when_the_deciding_gateway_is_killed(two_groups: TwoGroups) -> None:
    """Slow consumers on both gateways, gwB delivering the queue (its consumer came first), so
    gwB decides: it grows the queue, and is killed -9 once it has. gwA takes the delivery
    over and with it the decisions: the queue stays within its bounds, changes one step at a
    time, goes back to 1 partition once drained, and every confirmed message arrives."""
    gw_a, gw_b = two_groups.gateways
    auto_queue(gw_a, 600, pika.BasicProperties(delivery_mode=2))
    on_b = AckingConsumer(gw_b.url, "auto", delay_s=0.01)
    on_b.start()
    check_for(10, lambda: len(on_b.received) > 0)  # gwB holds the queue's lease
    on_a = AckingConsumer(gw_a.url, "auto", delay_s=0.01)
    on_a.start()

    check_for(20, lambda: autoscale(gw_b)["open_partitions"] >= 2)
    assert autoscale(gw_b)["deciding_here"]
    gw_b.stop(signal.SIGKILL)
    killed_at = time.monotonic()
    check_for(30, lambda: autoscale(gw_a)["deciding_here"])
    print(f"gwA decides {time.monotonic() - killed_at:.1f} s after gwB was killed")

    def received() -> set[bytes]:
        return {b for c in (on_a, on_b) for b, _ in c.received}

    check_for(60, lambda: len(received()) >= 600)
    check_for(60, lambda: autoscale(gw_a)["open_partitions"] == 1)
    decisions = autoscale(gw_a)["decisions"]
    assert decisions and decisions[-1]["to"] == 1, decisions
    assert all(abs(d["to"] - d["from"]) == 1 and 1 <= d["to"] <= 3 for d in decisions)
    on_a.stop.set()
    on_a.join(10)
    assert received() == {b"%d" % n for n in range(600)}
