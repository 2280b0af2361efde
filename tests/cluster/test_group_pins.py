"""Tenant isolation on two broker groups (meta/group_pins.py): a queue pinned by its
``x-mqgw-groups`` argument, by a policy's ``groups`` or by its vhost's ``default_groups`` is
placed, grown and moved only there; a move elsewhere is 409, and a bad pin 406/400."""

from __future__ import annotations

import json

import pika
import pytest
import redis

from meta.redis_keys import RedisKeys
from tests.cluster.conftest import TwoGroups


def declare(url: str, queue: str, arguments: dict[str, object] | None = None) -> None:
    with pika.BlockingConnection(pika.URLParameters(url)) as conn:
        conn.channel().queue_declare(queue, durable=True, arguments=arguments)


def test_pins_hold_through_declare_grow_and_move(two_groups: TwoGroups) -> None:
    gw_a, gw_b = two_groups.gateways
    declare(gw_a.url, "tenant-a", {"x-mqgw-groups": ["g2"], "x-mqgw-partitions": 3})
    assert two_groups.route("tenant-a") == ["g2"] * 3
    status, answer = gw_b.admin("POST", "/api/queues/%2F/tenant-a/scale",
                                {"partitions": 5, "wait": True})  # fmt: skip
    assert status == 200, answer
    assert two_groups.route("tenant-a") == ["g2"] * 5  # grown on its pin only
    status, answer = gw_a.admin("POST", "/api/queues/%2F/tenant-a/move", {"to": "g1"})
    assert status == 409 and "pinned to broker group(s) g2" in answer["reason"], answer
    assert two_groups.route("tenant-a") == ["g2"] * 5  # nothing changed

    policy = {"pattern": "^tenant-b", "definition": {"groups": "g1"}}
    assert gw_a.admin("PUT", "/api/policies/%2F/pin-b", policy)[0] in (201, 204)
    declare(gw_b.url, "tenant-b-1", {"x-mqgw-partitions": 4})
    assert two_groups.route("tenant-b-1") == ["g1"] * 4
    bad = {"pattern": "^x", "definition": {"groups": []}}
    status, answer = gw_a.admin("PUT", "/api/policies/%2F/bad", bad)
    assert status == 400 and "name at least one broker group" in answer["reason"]

    status, _ = gw_a.admin("PUT", "/api/vhosts/iso", {"default_groups": ["g2"]})
    assert status in (201, 204)
    status, vhost = gw_b.admin("GET", "/api/vhosts/iso")
    assert status == 200 and vhost["default_groups"] == ["g2"]
    for gateway in (gw_a, gw_b):
        assert gateway.admin(
            "PUT", "/api/permissions/iso/guest", {"configure": ".*", "write": ".*", "read": ".*"}
        )[0] in (201, 204)
    declare(gw_b.url.replace("/%2F", "/iso"), "in-iso", {"x-mqgw-partitions": 2})
    client = redis.Redis.from_url(two_groups.redis.url, decode_responses=True)
    placed = json.loads(client.get(RedisKeys().route("iso", "in-iso")) or "null")
    client.close()
    assert placed == ["g2", "g2"]


def test_a_bad_pin_argument_is_406(two_groups: TwoGroups) -> None:
    url = pika.URLParameters(two_groups.gateways[0].url)
    with (
        pika.BlockingConnection(url) as conn,
        pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed,
    ):
        conn.channel().queue_declare("odd", arguments={"x-mqgw-groups": 7})
    assert closed.value.reply_code == 406
    assert "invalid arg 'x-mqgw-groups'" in closed.value.reply_text
