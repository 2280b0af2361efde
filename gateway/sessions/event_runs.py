"""A read's events cut into runs that one call handles: publishes in a row (one store append,
gateway/sessions/batch_publish.py) and basic.acks in a row on one channel (one settle,
basic_methods.basic_acks). Order is kept: a run ends where another kind of event comes."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from pamqp.commands import Basic

from gateway.amqp import ChannelMethod, Event, Publish

PUBLISHES = -1  # the run's key for publishes (acks are keyed by their channel)


def event_runs(events: Iterable[Event]) -> Iterator[tuple[int | None, list[Any]]]:
    """(key, events) in order: PUBLISHES and the publishes of a run, a channel number and
    the ack events of a run on it, or None and any other event alone."""
    run: list[Any] = []
    run_on: int | None = None
    for event in events:
        if isinstance(event, Publish):
            on: int | None = PUBLISHES
        elif isinstance(event, ChannelMethod) and type(event.method) is Basic.Ack:
            on = event.channel
        else:
            on = None
        if run and on != run_on:
            yield run_on, run
            run = []
        if on is None:
            yield None, [event]
            continue
        run_on = on
        run.append(event)
    if run:
        yield run_on, run
