"""The embedded metadata store and versioned routes: kept under "routes" in metadata.json,
absent from files written before routes, and a transient queue's route is gone after a
restart with its queue (Redis keeps transient queues; the gateway deletes them)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from meta.local_document import FILE_NAME
from meta.local_store import LocalMetadataStore
from meta.queue_route import initial_route
from tests.meta.builders import qdef

pytestmark = pytest.mark.anyio


async def test_routes_are_in_the_file_and_a_transient_queue_s_is_not_read_back(
    tmp_path: Path,
) -> None:
    store = LocalMetadataStore(tmp_path / "main")
    orders = await store.declare_queue(qdef("orders"))
    temp = await store.declare_queue(qdef("temp", durable=False))
    route = initial_route("/", "orders", orders.queue_id, 4)
    await store.set_route(route, None)
    await store.set_route(initial_route("/", "temp", temp.queue_id, 2), None)
    document = json.loads((tmp_path / "main" / FILE_NAME).read_bytes())
    assert [(r["queue"], r["queue_id"]) for r in document["routes"]] == [
        ("orders", orders.queue_id),
        ("temp", temp.queue_id),
    ]
    reopened = LocalMetadataStore(tmp_path / "main")
    try:
        assert await reopened.get_route("/", "orders") == route
        assert await reopened.get_route("/", "temp") is None
    finally:
        await reopened.close()
        await store.close()


async def test_a_file_from_before_routes_opens_with_none(tmp_path: Path) -> None:
    store = LocalMetadataStore(tmp_path / "main")
    orders = await store.declare_queue(qdef("orders"))
    await store.set_route(initial_route("/", "orders", orders.queue_id, 4), None)
    await store.close()
    path = tmp_path / "main" / FILE_NAME
    document = json.loads(path.read_bytes())
    del document["routes"]
    path.write_text(json.dumps(document))
    older = LocalMetadataStore(tmp_path / "main")
    try:
        assert await older.get_queue("/", "orders") == orders
        assert await older.get_route("/", "orders") is None
    finally:
        await older.close()


async def test_a_deleted_queue_s_route_leaves_the_file(tmp_path: Path) -> None:
    store = LocalMetadataStore(tmp_path / "main")
    try:
        for name in ("orders", "kept"):
            queue = await store.declare_queue(qdef(name))
            await store.set_route(initial_route("/", name, queue.queue_id, 4), None)
        await store.delete_queue("/", "orders")
        document = json.loads((tmp_path / "main" / FILE_NAME).read_bytes())
        assert [r["queue"] for r in document["routes"]] == ["kept"]
    finally:
        await store.close()
