"""A queue id Redis handed out and then lost (a failover to a replica that missed the
declare, docs/metadata.md): the brokers still hold the lost queue and its messages under
that id. A running gateway that sees the metadata feed's gap raises Redis's counter past
every id the brokers hold, so a new queue never gets the id again and never shows the lost
queue's messages. (A gateway that starts deletes the brokers' queues that no record names,
node.start, so there is nothing to meet then.)"""

from __future__ import annotations

import json

import pika
import redis

from bench.servers import check_for
from meta.redis_keys import RedisKeys
from tests.cluster.conftest import Cluster
from tests.cluster.test_two_gateways import channel


def test_a_lost_queue_id_is_not_handed_out_again(cluster: Cluster) -> None:
    gateway = cluster.add_gateway("gw-a")
    conn, ch = channel(gateway)
    ch.confirm_delivery()
    ch.queue_declare("lost", durable=True)
    for n in range(5):
        ch.basic_publish("", "lost", b"lost %d" % n, pika.BasicProperties(delivery_mode=2))
    conn.close()
    keys = RedisKeys()
    client = redis.Redis.from_url(cluster.redis.url)
    queue_id = json.loads(client.get(keys.queue("/", "lost")) or b"{}")["queue_id"]
    # What a promoted replica that missed the declare holds: no queue, an older counter;
    # and the gateway sees a new run id.
    client.delete(keys.queue("/", "lost"), keys.route("/", "lost"))
    client.srem(keys.queue_index("/"), "lost")
    client.set(keys.queue_ids, queue_id - 1)
    client.close()
    cluster.redis.restart()
    check_for(15, lambda: "vhost '/' reloaded" in gateway.log(), interval_s=0.1)
    client = redis.Redis.from_url(cluster.redis.url)
    try:
        conn, ch = channel(gateway)
        ch.queue_declare("fresh", durable=True)
        fresh_id = json.loads(client.get(keys.queue("/", "fresh")) or b"{}")["queue_id"]
        method, _, body = ch.basic_get("fresh", auto_ack=True)
        conn.close()
    finally:
        client.close()
    assert fresh_id > queue_id
    assert (method, body) == (None, None)  # empty: none of the lost queue's messages
