"""Short constructors for metadata definitions in vhost "/", and feed helpers for tests."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any

import anyio

from meta.change_feed import Change, ChangeEvent
from meta.models import BindingDef, ExchangeDef, QueueDef


def xdef(name: str, type_: str = "direct", **kw: Any) -> ExchangeDef:
    return ExchangeDef(vhost=kw.pop("vhost", "/"), name=name, type=type_, **kw)


def qdef(name: str, **kw: Any) -> QueueDef:
    return QueueDef(vhost=kw.pop("vhost", "/"), name=name, **kw)


def qbind(source: str, queue: str, key: str = "", **kw: Any) -> BindingDef:
    return BindingDef(
        vhost="/", source=source, destination=queue, destination_type="queue", routing_key=key, **kw
    )


def xbind(source: str, dest: str, key: str = "", **kw: Any) -> BindingDef:
    return BindingDef(
        vhost="/",
        source=source,
        destination=dest,
        destination_type="exchange",
        routing_key=key,
        **kw,
    )


async def next_events(
    feed: AsyncGenerator[ChangeEvent, None], count: int, timeout_s: float = 1.0
) -> list[ChangeEvent]:
    """The next ``count`` events of a follower, or fail after ``timeout_s``."""
    events: list[ChangeEvent] = []
    with anyio.fail_after(timeout_s):
        while len(events) < count:
            events.append(await anext(feed))
    return events


async def changes_until(
    feed: AsyncGenerator[ChangeEvent, None], last: tuple[str, str], timeout_s: float = 1.0
) -> list[Change]:
    """Changes up to and including the first of kind/name ``last``; a Reload fails."""
    seen: list[Change] = []
    with anyio.fail_after(timeout_s):
        while True:
            event = await anext(feed)
            assert isinstance(event, Change), f"unexpected {event}"
            seen.append(event)
            if (event.kind, event.name) == last:
                return seen
