"""Dead-lettering as RabbitMQ 3.10 does it (rabbit_dead_letter), on raw property bytes.

A message leaving a queue as rejected, expired, maxlen or delivery_limit is republished to the
queue's dead-letter exchange with:
- ``x-death``: an array of tables, most recent first, one per (queue, reason); a repeat death
  for the same pair increments that entry's ``count`` (its other fields stay as first written)
  and moves it to the front. Fields: count (long), reason, queue, time (timestamp, seconds),
  exchange, routing-keys (array of longstr: the publish key and the CC keys) and
  original-expiration when the message carried an expiration.
- ``x-first-death-reason``, ``-queue``, ``-exchange`` set once, at the first death.
- the ``expiration`` property removed (so it does not expire again in the next queue);
- the dead-letter routing key if the queue has one (and then the CC header is removed), else
  the original routing keys.

At-least-once (``x-dead-letter-strategy: at-least-once``, RabbitMQ's quorum-queue option, in
force only with ``x-overflow: reject-publish`` and a dead-letter exchange, as in RabbitMQ;
classic queues refuse the argument as RabbitMQ 3.10 does): the original stays unsettled in
its queue (its offset holds the committed position, so a restart delivers it again) until the
dead letter's append is durable; a dead letter that routes nowhere, or whose append fails,
is kept and retried every housekeeping tick (about a second).

Cycles (checked on the updated x-death, as rabbit_dead_letter:publish does): a dead letter
routed into a queue it already died in is dropped for that queue unless some death since
then was a rejection (a client decided, so it is not an automatic loop).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from gateway.amqp import property_bytes as pb

X_DEATH = "x-death"
FIRST_DEATH = ("x-first-death-reason", "x-first-death-queue", "x-first-death-exchange")


class DeadLetter(NamedTuple):
    """A message leaving ``queue`` for the reason given, to be republished to ``dlx``."""

    queue: str
    reason: str  # rejected | expired | maxlen | delivery_limit
    exchange: str
    routing_key: str
    properties: bytes
    body: bytes
    persistent: bool
    dlx: str
    dlrk: str | None
    to_dlq: bool = False  # dlrk names the queue's own .dlq: declare it if missing
    # x-dead-letter-strategy at-least-once: called once the dead letter is durable (the
    # original is settled then, not before); None: at-most-once (settled when it left).
    settled: Callable[[], None] | None = None


class Republish(NamedTuple):
    exchange: str
    routing_key: str
    properties: bytes
    deaths: list[tuple[str, str]]  # (queue, reason) of its deaths, this one first


def _headers(fields: dict[int, bytes]) -> list[tuple[str, str, bytes]]:
    raw = fields.get(pb.HEADERS)
    return [] if raw is None else pb.split_table(raw)


def _death_key(entry: list[tuple[str, str, bytes]]) -> tuple[str, str]:
    values = {key: pb.decode_scalar(tag, raw) for key, tag, raw in entry}
    queue, reason = values.get("queue"), values.get("reason")
    return (queue if isinstance(queue, str) else "", reason if isinstance(reason, str) else "")


def _cc_keys(headers: list[tuple[str, str, bytes]]) -> list[str]:
    for key, tag, raw in headers:
        if key == "CC" and tag == "A":
            return [pb.decode_scalar(t, v) for t, v in pb.split_array(raw) if t == "S"]
    return []


def republish(letter: DeadLetter, now_s: int) -> Republish:
    """The message as the dead-letter exchange receives it."""
    fields = pb.split_properties(letter.properties)
    headers = _headers(fields)
    expiration = pb.shortstr_value(fields.pop(pb.EXPIRATION, None))
    info: list[tuple[str, str, bytes]] = [
        ("reason", "S", pb.longstr(letter.reason)),
        ("queue", "S", pb.longstr(letter.queue)),
        ("time", "T", pb.timestamp(now_s)),
        ("exchange", "S", pb.longstr(letter.exchange)),
        (
            "routing-keys",
            "A",
            pb.join_array(("S", pb.longstr(k)) for k in [letter.routing_key, *_cc_keys(headers)]),
        ),
    ]
    if expiration is not None:
        info.append(("original-expiration", "S", pb.longstr(expiration)))

    existing = next((raw for key, tag, raw in headers if key == X_DEATH and tag == "A"), None)
    entries = (
        []
        if existing is None
        else [pb.split_table(raw) for tag, raw in pb.split_array(existing) if tag == "F"]
    )
    deaths = [_death_key(entry) for entry in entries]
    if existing is None:
        first = [
            (FIRST_DEATH[0], "S", pb.longstr(letter.reason)),
            (FIRST_DEATH[1], "S", pb.longstr(letter.queue)),
            (FIRST_DEATH[2], "S", pb.longstr(letter.exchange)),
        ]
        new_entry = [("count", "l", pb.long(1)), *info]
        others: list[list[tuple[str, str, bytes]]] = []
        headers = [(X_DEATH, "A", b""), *first, *headers]
    else:
        match = (letter.queue, letter.reason)
        index = next((i for i, key in enumerate(deaths) if key == match), None)
        if index is None:
            new_entry = [("count", "l", pb.long(1)), *info]
            others = entries
        else:
            new_entry = [_incremented(e) for e in entries[index]]
            others = entries[:index] + entries[index + 1 :]
        new_entry = sorted(new_entry, key=lambda e: e[0])
    x_death = pb.join_array(("F", pb.join_table(e)) for e in [new_entry, *others])
    headers = [(k, t, x_death if k == X_DEATH else raw) for k, t, raw in headers]
    routing_key = letter.routing_key
    if letter.dlrk is not None:
        routing_key = letter.dlrk
        headers = [h for h in headers if h[0] != "CC"]
    fields[pb.HEADERS] = pb.join_table(headers)
    ordered = [(letter.queue, letter.reason), *(_death_key(e) for e in others)]
    return Republish(letter.dlx, routing_key, pb.join_properties(fields), ordered)


def _incremented(field: tuple[str, str, bytes]) -> tuple[str, str, bytes]:
    key, tag, raw = field
    if key != "count":
        return field
    count = pb.decode_scalar(tag, raw)
    return key, "l", pb.long((count if isinstance(count, int) else 0) + 1)


def is_cycle(target: str, reason: str, deaths: list[tuple[str, str]]) -> bool:
    """rabbit_dead_letter:is_cycle: back in ``target`` with no rejection on the way."""
    if reason == "rejected":
        return False
    for queue, death_reason in deaths:
        if death_reason == "rejected":
            return False
        if queue == target:
            return True
    return False
