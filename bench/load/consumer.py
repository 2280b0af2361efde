"""Consumer worker: one process, one connection, a consumer on each of its queues.

Consumer tags are ``c<index>`` so a delivery maps to its queue with one dict lookup. Every
received batch is acknowledged with one ``basic.ack(multiple=True)`` per channel, or with one
``basic.ack`` per message (``ack_each``) written together; a paced consumer
(``ack_interval_s``) instead acks one message at a time (the slow consumer).
Each queue's sequence numbers are checked in a bytearray: a second sighting is a duplicate,
what is never seen is lost. Latency is receive time minus the send time in the body.
"""

from __future__ import annotations

import time
from array import array
from collections import deque
from dataclasses import dataclass
from typing import Any

from pamqp import commands

from bench.load.connection import RECV_BYTES, RawConnection
from bench.load.frames import basic_ack
from bench.load.workers import WorkerLink, worker_main


@dataclass(frozen=True)
class ConsumePlan:
    url: str
    queues: tuple[str, ...]
    expected: tuple[int, ...]  # per queue: how many sequence numbers can arrive (0..n-1)
    prefetch: int
    no_ack: bool
    deadline_mono: float
    ack_interval_s: float = 0.0  # > 0: ack single messages at this pace
    ack_each: bool = False  # ack every delivery on its own (one write per read)
    consumers_per_channel: int = 500  # 10k consumers must fit in channel_max


def _subscribe(conn: RawConnection, plan: ConsumePlan) -> dict[bytes, int]:
    tags: dict[bytes, int] = {}
    per = plan.consumers_per_channel
    for first in range(0, len(plan.queues), per):
        channel = 1 + first // per
        conn.open_channel(channel)
        if not plan.no_ack:  # per-consumer prefetch (global=False), as RabbitMQ applies it
            qos = commands.Basic.Qos(prefetch_count=plan.prefetch)
            conn.call(channel, qos, commands.Basic.QosOk)
        methods = []
        for index in range(first, min(first + per, len(plan.queues))):
            tag = f"c{index}"
            tags[tag.encode()] = index
            methods.append(
                commands.Basic.Consume(
                    queue=plan.queues[index], consumer_tag=tag, no_ack=plan.no_ack
                )
            )
        conn.pipeline(channel, methods, commands.Basic.ConsumeOk)
    return tags


def _recv_timeout_s(plan: ConsumePlan) -> float:
    """How long a receive may block: short enough for the paced consumer to ack on time and
    for the loop to see stop, deadline and snapshot a few times a second."""
    return min(0.05, plan.ack_interval_s) if plan.ack_interval_s else 0.1


def consume(plan: ConsumePlan, link: WorkerLink) -> dict[str, Any]:
    conn = RawConnection(plan.url)
    tags = _subscribe(conn, plan)
    seen = [bytearray(n) for n in plan.expected]
    counts = [0] * len(plan.queues)
    latencies_us = array("q")
    lat_append = latencies_us.append
    dups = unexpected = redelivered = received = unique = 0
    first_ns = last_ns = 0
    snapshot: list[int] | None = None
    to_ack: dict[int, int] = {}  # channel -> highest delivery tag received
    paced: deque[tuple[int, int]] = deque()  # (channel, tag) for the paced consumer
    ack_each = plan.ack_each and not plan.no_ack
    each: list[bytes] = []  # this read's single acks (ack_each)
    next_ack = 0.0
    sock, parser = conn.sock, conn.parser
    deliveries = parser.deliveries
    now_ns = time.monotonic_ns
    sock.settimeout(_recv_timeout_s(plan))
    link.ready()
    check_at = 0.0
    while True:
        mono = time.monotonic()
        if mono > check_at:  # stop, deadline and snapshot a few times a second only
            link.report(unique)
            # The snapshot before the stop: a run whose consumers keep up is stopped within
            # one check of the publishers' end, and a consumer that saw both at once left
            # its queues counted as nothing at that end (min_queue_share_at_publish_end 0).
            if snapshot is None and link.snapshot is not None and link.snapshot.is_set():
                snapshot = counts.copy()
            if link.stopped() or mono > plan.deadline_mono:
                break
            check_at = mono + 0.05
        if paced and mono >= next_ack:
            channel, tag = paced.popleft()
            sock.sendall(basic_ack(channel, tag, False))
            next_ack = max(next_ack + plan.ack_interval_s, mono)
        if not deliveries:
            try:
                data = sock.recv(RECV_BYTES)
            except TimeoutError:
                continue
            if not data:
                raise ConnectionError("the server closed the connection")
            parser.feed(data)
            if parser.others:
                conn.check_others()
            if not deliveries:
                continue
        now = now_ns()
        if not first_ns:
            first_ns = now
        last_ns = now
        for channel, ctag, dtag, redo, seq, sent_ns in deliveries:
            q = tags[ctag]
            bits = seen[q]
            if 0 <= seq < len(bits):
                if bits[seq]:
                    dups += 1
                else:
                    bits[seq] = 1
                    counts[q] += 1
                    unique += 1
            else:
                unexpected += 1
            if redo:
                redelivered += 1
            lat_append((now - sent_ns) // 1000)
            to_ack[channel] = dtag
            if ack_each:
                each.append(basic_ack(channel, dtag, False))
        received += len(deliveries)
        if plan.ack_interval_s:  # prefetch is small here: one entry per delivery is fine
            paced.extend((d[0], d[2]) for d in deliveries)
        deliveries.clear()
        if plan.no_ack or plan.ack_interval_s:
            to_ack.clear()
        elif ack_each:
            sock.sendall(b"".join(each))
            each.clear()
        else:
            sock.sendall(b"".join(basic_ack(ch, tag, True) for ch, tag in to_ack.items()))
            to_ack.clear()
    conn.close()
    return _report(
        received, counts, snapshot, dups, unexpected, redelivered, latencies_us, first_ns, last_ns
    )


def _report(
    received: int,
    counts: list[int],
    snapshot: list[int] | None,
    duplicated: int,
    unexpected: int,
    redelivered: int,
    latencies_us: array[int],
    first_ns: int,
    last_ns: int,
) -> dict[str, Any]:
    """What the worker sends back to the runner once its loop ends."""
    return {
        "received": received,
        "unique_per_queue": counts,
        "snapshot_per_queue": snapshot,
        "duplicated": duplicated,
        "unexpected": unexpected,
        "redelivered": redelivered,
        "latencies_us": latencies_us.tobytes(),
        "first_ns": first_ns,
        "last_ns": last_ns,
    }


def main(plan: ConsumePlan, link: WorkerLink) -> None:
    """Process entry point."""
    worker_main(consume, plan, link)
