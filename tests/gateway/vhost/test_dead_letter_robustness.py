"""Dead-lettering must not trust stored property bytes: a message whose properties the broker
cannot edit is dropped with a log line, and the node's hand-over task carries on."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from gateway.queues.dead_letter import DeadLetter
from gateway.queues.scheduler import PushScheduler
from gateway.vhost import VirtualHost
from meta.local_store import LocalMetadataStore
from meta.models import QueueDef
from storage import FlushPolicy, StoreConfig, open_embedded_store


def test_unreadable_properties_are_dropped_not_fatal(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async def scenario() -> tuple[int, int]:
        config = StoreConfig(tmp_path / "store", flush=FlushPolicy.ASYNC)
        async with open_embedded_store(config) as store:
            meta = LocalMetadataStore(tmp_path / "meta")
            vhost = VirtualHost("/", meta, store, PushScheduler(), partitions=1)
            await vhost.load()
            target = await vhost.declare_queue(QueueDef(vhost="/", name="dead"), False, "c")
            for properties in (b"\x00\x01", b"\x20\x00\x00\x00\x00\x09\x01xF\x00"):
                vhost.dead_letters.append(
                    DeadLetter("q", "rejected", "", "q", properties, b"x", False, "", "dead")
                )
            vhost.dead_letters.append(
                DeadLetter("q", "rejected", "", "q", b"\x00\x00", b"ok", False, "", "dead")
            )
            stored = await vhost.flush_dead_letters()
            return stored, target.ready_count

    stored, ready = anyio.run(scenario)
    assert (stored, ready) == (1, 1)  # the readable one went through
    assert caplog.text.count("a dead letter with unreadable properties dropped") == 2
