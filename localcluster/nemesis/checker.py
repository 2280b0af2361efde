"""The nemesis run's verdict on a history, as Jepsen's total-queue checker gives it.

After the faults stop and the cluster heals, every queue is drained; the history is every
publish attempt (confirmed or not) and every delivery. Pure: a list in, a verdict out.

- lost: confirmed, never delivered;
- unexpected: delivered, never published;
- unflagged duplicates: a message delivered n times with fewer than n - 1 of those deliveries
  flagged ``redelivered`` (the flagged copy may arrive first: a replaced gateway's last
  delivery can reach its client after the new holder's);
- out of order: on a one-partition queue, one consumer got two first deliveries of one
  channel's messages in another order than they were published (RabbitMQ's per-channel
  order; redeliveries may come at any point); on a keyed-order queue, the same per order
  key. A publisher that reconnects opens another channel: a message it gave up on with the
  old one may still land after the next ones.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

SHOWN = 20  # messages named per finding in a report


@dataclass(frozen=True)
class Published:
    queue: str
    publisher: str  # one channel
    seq: int  # its publish order on that channel
    confirmed: bool
    at: float = 0.0  # time.monotonic() when the answer came (stalls, in the run's report)
    channel: str = ""  # the channel it went out on (order is per channel); "": the publisher
    order_key: str = ""  # a keyed-order queue keeps order per channel and key

    @property
    def key(self) -> str:
        return f"{self.publisher}:{self.seq}"


@dataclass(frozen=True)
class Delivered:
    queue: str
    consumer: str
    key: str  # "<publisher>:<seq>", the body
    redelivered: bool
    at: float = 0.0  # time.monotonic() when it came (a post-mortem's timeline)


@dataclass
class Verdict:
    published: int = 0
    confirmed: int = 0
    delivered: int = 0
    lost: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    duplicates: int = 0  # every delivery after the first
    unflagged: list[str] = field(default_factory=list)
    out_of_order: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.lost or self.unexpected or self.unflagged or self.out_of_order)

    def describe(self) -> str:
        lines = [
            f"published {self.published} (confirmed {self.confirmed}), delivered "
            f"{self.delivered} ({self.duplicates} again): " + ("clean" if self.ok else "FAILED")
        ]
        for name in ("lost", "unexpected", "unflagged", "out_of_order"):
            found: list[str] = getattr(self, name)
            if found:
                more = f" (+{len(found) - SHOWN} more)" if len(found) > SHOWN else ""
                lines.append(f"  {name}: {len(found)}: {', '.join(found[:SHOWN])}{more}")
        return "\n".join(lines)


def check(
    published: Iterable[Published],
    delivered: Iterable[Delivered],
    one_partition: Iterable[str] = (),
) -> Verdict:
    verdict = Verdict()
    sent = {p.key: p for p in published}
    verdict.published = len(sent)
    verdict.confirmed = sum(1 for p in sent.values() if p.confirmed)
    seen: Counter[str] = Counter()
    flagged: Counter[str] = Counter()
    ordered = set(one_partition)
    # (queue, consumer, channel, order key) -> the highest sequence number and its message
    last_seq: dict[tuple[str, str, str, str], tuple[int, str]] = {}
    for d in delivered:
        verdict.delivered += 1
        seen[d.key] += 1
        origin = sent.get(d.key)
        if origin is None:
            verdict.unexpected.append(f"{d.key} on {d.queue}")
            continue
        if d.redelivered:
            flagged[d.key] += 1
        if seen[d.key] > 1:
            verdict.duplicates += 1
            if seen[d.key] - 1 > flagged[d.key]:
                verdict.unflagged.append(f"{d.key} to {d.consumer}")
            continue
        if d.queue in ordered and not d.redelivered:
            where = (d.queue, d.consumer, origin.channel or origin.publisher, origin.order_key)
            before = last_seq.get(where)
            if before is not None and origin.seq < before[0]:
                verdict.out_of_order.append(f"{d.key} after {before[1]} to {d.consumer}")
            if before is None or origin.seq > before[0]:
                last_seq[where] = (origin.seq, d.key)
    by_queue: defaultdict[str, list[str]] = defaultdict(list)
    for key, p in sent.items():
        if p.confirmed and not seen[key]:
            by_queue[p.queue].append(key)
    verdict.lost = [f"{key} on {queue}" for queue, keys in sorted(by_queue.items()) for key in keys]
    return verdict
