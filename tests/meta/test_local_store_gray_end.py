"""The embedded metadata store and ended gray releases: a transient queue is gone after a
restart, and its end with it (Redis keeps transient queues; the gateway deletes them)."""

from __future__ import annotations

from pathlib import Path

import pytest

from meta.local_store import LocalMetadataStore
from tests.meta.builders import qdef
from tests.meta.test_meta_contract_gray_end import ORDERS

pytestmark = pytest.mark.anyio


async def test_a_transient_queue_s_end_is_not_read_back_after_a_restart(
    tmp_path: Path,
) -> None:
    """Local store: a transient queue is gone after a restart, and its end with it (Redis
    keeps transient queues; the gateway deletes them, and the end goes as above)."""
    store = LocalMetadataStore(tmp_path / "main")
    await store.declare_queue(qdef("orders", partitions=4))
    await store.declare_queue(qdef("temp", durable=False, partitions=4))
    await store.set_gray_end(ORDERS)
    await store.set_gray_end(ORDERS.model_copy(update={"queue": "temp"}))
    reopened = LocalMetadataStore(tmp_path / "main")
    try:
        assert await reopened.list_gray_ends() == [ORDERS]
        assert await reopened.get_gray_end("/", "temp") is None
    finally:
        await reopened.close()
        await store.close()
