"""Any gateway's management API answers for the whole cluster, as any RabbitMQ node does:
every live gateway's connections, channels and consumers, each naming its gateway in
``node``; totals and one node entry per gateway; closing a connection another gateway
holds; a killed gateway's objects gone from the views within a few seconds."""

from __future__ import annotations

import base64
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

import pika
import pika.exceptions
import pytest

from bench.servers import GatewayServer, check_for
from tests.cluster.conftest import Cluster

QUEUE = "views-q"


def client(gateway: GatewayServer, name: str, user: str = "guest") -> pika.BlockingConnection:
    params = pika.URLParameters(gateway.url)
    params.credentials = pika.PlainCredentials(user, user)
    params.client_properties = {"connection_name": name}
    return pika.BlockingConnection(params)


def get(gateway: GatewayServer, path: str, user: str = "guest") -> Any:
    status, body = gateway.admin("GET", path, auth=(user, user))
    assert status == 200, (path, status, body)
    return body


def by_client(rows: list[dict[str, Any]]) -> dict[str, str]:
    """connection_name -> node, of the connections listed."""
    return {r["client_properties"]["connection_name"]: r["node"] for r in rows}


def delete(gateway: GatewayServer, name: str, reason: str) -> int:
    path = "/api/connections/" + urllib.parse.quote(name, safe="")
    request = urllib.request.Request(
        f"http://127.0.0.1:{gateway.admin_port}{path}", method="DELETE"
    )
    request.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
    request.add_header("X-Reason", reason)
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as error:
        return int(error.code)


def test_every_gateway_lists_every_gateways_objects_with_its_node(cluster: Cluster) -> None:
    gateways = [cluster.add_gateway(name) for name in ("gwA", "gwB", "gwC")]
    status, _ = gateways[0].admin("PUT", "/api/users/watcher", {"password": "watcher",
                                                                "tags": "management"})  # fmt: skip
    assert status in (201, 204)
    status, _ = gateways[0].admin(
        "PUT", "/api/permissions/%2F/watcher", {"configure": ".*", "write": ".*", "read": ".*"}
    )
    assert status in (201, 204)
    conns = []
    for gateway in gateways:
        conn = client(gateway, f"app-{gateway.data_dir.name}")
        ch = conn.channel()
        ch.queue_declare(QUEUE)
        ch.basic_consume(QUEUE, lambda *_: None, consumer_tag=f"tag-{gateway.data_dir.name}")
        conns.append(conn)
    # (the user reaches gwB through the change feed: a login may come first)
    watched = check_for(10, lambda: client(gateways[1], "watched-by-watcher", user="watcher"))
    conns.append(watched)
    expected = {f"app-{g.data_dir.name}": g.data_dir.name for g in gateways}
    expected["watched-by-watcher"] = "gwB"

    for gateway in gateways:  # each answers for all three
        check_for(10, lambda g=gateway: by_client(get(g, "/api/connections")) == expected)
        channels = get(gateway, "/api/channels")
        assert sorted(c["node"] for c in channels) == ["gwA", "gwB", "gwC"]
        consumers = get(gateway, "/api/consumers")
        assert {c["consumer_tag"]: c["channel_details"]["node"] for c in consumers} == {
            f"tag-{g.data_dir.name}": g.data_dir.name for g in gateways
        }
        assert len(get(gateway, "/api/consumers/%2F")) == 3
        totals = get(gateway, "/api/overview")["object_totals"]
        assert (totals["connections"], totals["channels"], totals["consumers"]) == (4, 3, 3)
        nodes = get(gateway, "/api/nodes")
        assert sorted(n["name"] for n in nodes) == ["gwA", "gwB", "gwC"]
        assert all(n["running"] and n["uptime"] > 0 and n["mem_used"] > 0 for n in nodes)
        assert get(gateway, "/api/nodes/gwC")["name"] == "gwC"

    # One of another gateway's connections, its channels, one channel, from gwA.
    remote = next(c for c in get(gateways[0], "/api/connections") if c["node"] == "gwC")
    name = urllib.parse.quote(remote["name"], safe="")
    assert get(gateways[0], f"/api/connections/{name}")["node"] == "gwC"
    [channel] = get(gateways[0], f"/api/connections/{name}/channels")
    assert channel["node"] == "gwC" and channel["consumer_count"] == 1
    quoted = urllib.parse.quote(channel["name"], safe="")
    assert get(gateways[0], f"/api/channels/{quoted}")["number"] == 1
    # Pagination and sorting over the merged list.
    page = get(gateways[0], "/api/connections?page=2&page_size=3&sort=name&sort_reverse=true")
    assert (page["total_count"], page["filtered_count"], page["item_count"]) == (4, 4, 1)
    names = [c["name"] for c in get(gateways[0], "/api/connections?sort=name")]
    assert names == sorted(names) and len(names) == 4
    # A management user sees its own connections only, wherever they are; consumers of
    # the vhosts it may use (all three here).
    mine = get(gateways[0], "/api/connections", user="watcher")
    assert [(c["user"], c["node"]) for c in mine] == [("watcher", "gwB")]
    assert get(gateways[2], "/api/overview", user="watcher")["object_totals"]["connections"] == 1
    assert get(gateways[2], "/api/channels", user="watcher") == []
    assert len(get(gateways[2], "/api/consumers", user="watcher")) == 3
    for conn in conns:
        conn.close()


def test_delete_on_one_gateway_closes_a_connection_another_holds(cluster: Cluster) -> None:
    a, b = cluster.add_gateway("gwA"), cluster.add_gateway("gwB")
    conn = client(b, "held-by-b")
    check_for(10, lambda: "held-by-b" in by_client(get(a, "/api/connections")))
    [row] = [c for c in get(a, "/api/connections") if c["node"] == "gwB"]
    started = time.monotonic()
    assert delete(a, row["name"], "moving you elsewhere") == 204
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
        while time.monotonic() - started < 10:
            conn.process_data_events(time_limit=0.05)
    took = time.monotonic() - started
    assert closed.value.reply_code == 320
    assert closed.value.reply_text == "CONNECTION_FORCED - moving you elsewhere"
    print(f"remote close: 204 and the client closed {took * 1000:.0f} ms after the DELETE")
    assert delete(a, row["name"], "again") == 404  # gwB answers: not held (any more)
    assert delete(b, "127.0.0.1:1 -> 127.0.0.1:2", "nobody") == 404
    check_for(5, lambda: get(a, "/api/connections") == [] and get(b, "/api/connections") == [])


def test_a_killed_gateways_objects_vanish_from_the_views(cluster: Cluster) -> None:
    a, b = cluster.add_gateway("gwA"), cluster.add_gateway("gwB")
    conn = client(b, "on-b")
    conn.channel().basic_consume("amq.rabbitmq.reply-to", lambda *_: None, auto_ack=True)
    check_for(10, lambda: by_client(get(a, "/api/connections")) == {"on-b": "gwB"})
    assert sorted(n["name"] for n in get(a, "/api/nodes")) == ["gwA", "gwB"]
    b.kill()
    killed = time.monotonic()
    check_for(10, lambda: get(a, "/api/connections") == [] and get(a, "/api/channels") == [])
    gone = time.monotonic() - killed
    print(f"killed gateway's connections gone from the views after {gone:.2f} s")
    assert gone < 4.5  # the view's TTL (3 s) and a poll
    assert [n["name"] for n in get(a, "/api/nodes")] == ["gwA"]
    assert get(a, "/api/overview")["object_totals"]["connections"] == 0
