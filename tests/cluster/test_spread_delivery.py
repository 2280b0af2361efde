"""A plain queue of several partitions is delivered by every gateway with consumers on it,
each its own partitions (gateway/cluster/delivery_spread.py), on redis-server, broker groups
g1 and g2 and two `mqgw serve --meta` gateways, with pika publishers (confirms) and consumers
on both. Before, the gateway holding partition 0 delivered them all and the other gateway's
consumer got nothing.

Both consumers get a fair part; every confirmed message arrives once (a redelivery flagged
as such at most), each channel's in order; when one gateway's consumer leaves, the other
takes its partitions and gets everything published after."""

from __future__ import annotations

import time
from collections import Counter

import pika

from bench.servers import check_for
from tests.cluster.conftest import TwoGroups
from tests.harness.confirming_clients import AckingConsumer, ChannelPublishers

CHANNELS = 8  # per publisher


def test_a_queue_of_four_partitions_is_delivered_by_both_gateways(two_groups: TwoGroups) -> None:
    gw_a, gw_b = two_groups.gateways
    with pika.BlockingConnection(pika.URLParameters(gw_a.url)) as conn:
        conn.channel().queue_declare("hot", durable=True, arguments={"x-mqgw-partitions": 4})
    consumers = [AckingConsumer(gw_a.url, "hot"), AckingConsumer(gw_b.url, "hot")]
    # Each channel writes to a partition chosen at random: 16 channels leave none of the
    # gateways' halves with fewer than two but about once in 4,000 runs.
    publishers = [ChannelPublishers(gw_a.url, "hot", "a", channels=CHANNELS),
                  ChannelPublishers(gw_b.url, "hot", "b", channels=CHANNELS)]  # fmt: skip
    for worker in (*consumers, *publishers):
        worker.start()
    check_for(20, lambda: all(len(c.received) > 100 for c in consumers))  # both serving
    before = [len(c.received) for c in consumers]
    check_for(20, lambda: sum(len(c.received) for c in consumers) > sum(before) + 1500)
    counts = [len(c.received) - b for c, b in zip(consumers, before, strict=True)]
    share = min(counts) / sum(counts)
    print(f"deliveries by gateway while both consume: {counts} ({share:.0%} the smaller)")
    assert share >= 0.1, counts  # each gateway delivers its two partitions (before: 0 %)

    consumers[1].stop.set()  # gwB's consumer leaves: gwA takes its partitions over
    consumers[1].join(10)
    left_at = time.monotonic()
    pairs = [(p, len(p.confirmed)) for p in publishers]
    check_for(20, lambda: all(len(p.confirmed) > m + 200 for p, m in pairs))
    for publisher in publishers:
        publisher.stop.set()
        publisher.join(10)
    confirmed = {b for p in publishers for b in p.confirmed}
    check_for(30, lambda: confirmed <= {b for c in consumers for b, _ in c.received})
    print(f"gwA delivered everything {time.monotonic() - left_at:.1f} s after gwB's consumer left")
    consumers[0].stop.set()
    consumers[0].join(10)
    after = {b for p, m in pairs for b in p.confirmed[m:]}
    assert after <= set(consumers[0].bodies())  # gwA delivers every partition now

    assert sum(p.nacked for p in publishers) == 0
    arrivals = [item for c in consumers for item in c.received]
    assert {b for b, _ in arrivals} == confirmed  # none lost, nothing unknown
    # One delivery of each message unflagged at most (the other gateway's copy of one a
    # leaving consumer held comes flagged; the consumers' lists are not in one time order).
    unflagged = Counter(body for body, redelivered in arrivals if not redelivered)
    assert [b for b, n in unflagged.items() if n > 1] == [], "delivered twice, not flagged"
    for consumer in consumers:
        for publisher in publishers:
            for c in range(CHANNELS):
                prefix = f"{publisher.tag}{c}:".encode()
                numbers = [int(b.split(b":")[1]) for b, again in consumer.received
                           if b.startswith(prefix) and not again]  # fmt: skip
                assert numbers == sorted(numbers), f"channel {publisher.tag}{c} out of order"


def test_a_gateway_joining_takes_its_share_without_repeats(two_groups: TwoGroups) -> None:
    """gwA delivers all four partitions to a slow consumer (its prefetch always full); a
    consumer on gwB joins. gwA stops delivering the two partitions that go to gwB, hands
    each over once its consumer has acked what it held of it: nothing comes twice, not even
    flagged (before, gwB delivered again what gwA's consumer held unacked)."""
    gw_a, gw_b = two_groups.gateways
    with pika.BlockingConnection(pika.URLParameters(gw_a.url)) as conn:
        conn.channel().queue_declare("join", durable=True, arguments={"x-mqgw-partitions": 4})
    first = AckingConsumer(gw_a.url, "join", delay_s=0.002)
    publishers = ChannelPublishers(gw_a.url, "join", "a", channels=CHANNELS)
    first.start()
    publishers.start()
    check_for(20, lambda: len(first.received) > 300)
    joining = AckingConsumer(gw_b.url, "join", delay_s=0.002)
    joining.start()
    check_for(20, lambda: len(joining.received) > 300)  # gwB delivers its share
    publishers.stop.set()
    publishers.join(10)
    confirmed = set(publishers.confirmed)
    arrivals = lambda: [item for c in (first, joining) for item in c.received]  # noqa: E731
    check_for(30, lambda: confirmed <= {b for b, _ in arrivals()})
    for consumer in (first, joining):
        consumer.stop.set()
        consumer.join(10)
    bodies = [b for b, _ in arrivals()]
    assert [b for b, n in Counter(bodies).items() if n > 1] == []  # none twice
    assert [b for b, again in arrivals() if again] == []  # none flagged: none went out before
    assert set(bodies) == confirmed
