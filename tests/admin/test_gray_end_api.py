"""/api/gray/queues/{vhost}/{name}[/end] on a real embedded node (tests/admin/gray_node.py):
ending a queue's gray release takes its gray partitions away at once (202, then 200 with the
same record), GET shows the drain of the former gray partitions going down to nothing as the
messages are taken, DELETE resumes once; unknown queues are 404s, a queue without gray
partitions a 400, a call without credentials a 401, a monitoring user reads but does not
change; the end is loaded again when the node starts on the same data."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gateway.queues.runtime import QueueRuntime
from meta.models import GrayEnd
from tests.admin.gray_node import WATCHER, AdminNode, admin_node, recent

pytestmark = pytest.mark.anyio
QUEUE = "/api/queues/%2F/orders"
GRAY = "/api/gray/queues/%2F/orders"
END = GRAY + "/end"
ARGUMENTS = {"x-mqgw-partitions": 4, "x-mqgw-gray-partitions": 2}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # uvicorn


async def _declare(gw: AdminNode, arguments: dict[str, Any] = ARGUMENTS) -> None:
    status, body = await gw.call("PUT", QUEUE, {"durable": True, "arguments": arguments})
    assert status == 201, body


async def _publish(gw: AdminNode, count: int, gray: bool) -> None:
    properties: dict[str, Any] = {"delivery_mode": 2}  # persistent: kept over a restart
    if gray:
        properties["headers"] = {"x-gray": True}
    for n in range(count):
        body = {"routing_key": "orders", "payload": f"m{n}", "properties": properties}
        status, answer = await gw.call("POST", "/api/exchanges/%2F/amq.default/publish", body)
        assert (status, answer) == (200, {"routed": True})


async def _take(gw: AdminNode, count: int) -> int:
    """Take (and settle) up to ``count`` messages with a get; how many came."""
    body = {"count": count, "ackmode": "ack_requeue_false", "encoding": "auto"}
    status, taken = await gw.call("POST", QUEUE + "/get", body)
    assert status == 200, taken
    return len(taken)


def _queue(gw: AdminNode) -> QueueRuntime:
    return gw.node.vhosts["/"].queues["orders"]


def _gray_now(gw: AdminNode) -> list[int]:
    return list(_queue(gw).gray_parts)


async def _shown(gw: AdminNode) -> dict[str, Any]:
    status, shown = await gw.call("GET", GRAY)
    assert status == 200, shown
    return dict(shown)


async def test_end_show_the_drain_and_resume(tmp_path: Path) -> None:
    async with admin_node(tmp_path) as gw:
        await _declare(gw)
        await _publish(gw, 3, gray=False)
        await _publish(gw, 5, gray=True)
        assert _gray_now(gw) == [0, 3]
        assert await _shown(gw) == {
            "vhost": "/",
            "queue": "orders",
            "gray_partitions": 2,
            "gray_now": [0, 3],
            "ended": False,
            "set_at": None,
            "status": None,
        }

        status, ended = await gw.call("POST", END)
        assert status == 202, ended
        assert ended["vhost"] == "/" and ended["queue"] == "orders" and recent(ended["set_at"])
        ends = {int(p): offset for p, offset in ended["ends"].items()}
        assert set(ends) == {0, 3} and sum(ends.values()) == 5  # the gray messages only
        record = GrayEnd(vhost="/", queue="orders", ends=ends, set_at=ended["set_at"])
        assert await gw.node.meta.get_gray_end("/", "orders") == record
        assert gw.node.gray.ends == {("/", "orders"): record}
        assert _gray_now(gw) == [] and _queue(gw).behaviour.gray_partitions == 0
        assert await gw.call("POST", END) == (200, ended)  # once ended: the same record

        shown = await _shown(gw)
        assert (shown["gray_partitions"], shown["gray_now"]) == (2, [])
        assert (shown["ended"], shown["set_at"]) == (True, ended["set_at"])
        assert shown["status"] == {
            "partitions": [
                {"partition": 0, "messages": ends[0]},
                {"partition": 3, "messages": ends[3]},
            ],
            "left": 5,
        }
        # Every partition is read now: the gray messages come with the others.
        assert await _take(gw, 20) == 8
        shown = await _shown(gw)
        assert shown["status"]["left"] == 0 and shown["ended"]
        assert [p["messages"] for p in shown["status"]["partitions"]] == [0, 0]

        assert await gw.call("DELETE", END) == (204, None)
        assert await gw.node.meta.get_gray_end("/", "orders") is None
        assert gw.node.gray.ends == {}
        assert _gray_now(gw) == [0, 3]
        shown = await _shown(gw)
        assert (shown["ended"], shown["gray_now"], shown["status"]) == (False, [0, 3], None)
        status, body = await gw.call("DELETE", END)
        assert status == 404 and "has not ended" in body["reason"], body
        # Gray publishes go to the gray partitions again, and a new end counts them.
        await _publish(gw, 2, gray=True)
        status, again = await gw.call("POST", END)
        assert status == 202 and sum(again["ends"].values()) == 5 + 2, again


async def test_unknown_queues_and_queues_without_gray_partitions(tmp_path: Path) -> None:
    async with admin_node(tmp_path) as gw:
        for method, path in [("POST", END), ("GET", GRAY), ("DELETE", END)]:
            status, body = await gw.call(method, path)
            assert status == 404, (method, body)
            assert body["reason"] == "no queue 'orders' in vhost '/'", (method, body)
            status, body = await gw.call(method, path.replace("%2F", "nowhere"))
            assert (status, body["reason"]) == (404, "no vhost 'nowhere'"), (method, body)
        await _declare(gw, {"x-mqgw-partitions": 4})
        status, body = await gw.call("POST", END)
        assert status == 400, body
        assert body["reason"] == "queue 'orders' in vhost '/' has no gray partitions"
        assert await gw.node.meta.list_gray_ends() == []
        shown = await _shown(gw)
        assert (shown["gray_partitions"], shown["gray_now"], shown["ended"]) == (0, [], False)


async def test_who_may_read_and_change(tmp_path: Path) -> None:
    async with admin_node(tmp_path) as gw:
        await _declare(gw)
        for method, path in [("POST", END), ("GET", GRAY), ("DELETE", END)]:
            status, answer = await gw.call(method, path, auth=None)
            assert (status, answer["error"]) == (401, "not_authorized"), (method, path)
            assert (await gw.call(method, path, auth=("guest", "wrong")))[0] == 401
        assert (await gw.call("POST", END, auth=WATCHER))[0] == 403
        assert gw.node.gray.ends == {} and await gw.node.meta.list_gray_ends() == []
        assert (await gw.call("POST", END))[0] == 202
        assert (await gw.call("GET", GRAY, auth=WATCHER))[0] == 200
        assert (await gw.call("DELETE", END, auth=WATCHER))[0] == 403
        assert set(gw.node.gray.ends) == {("/", "orders")}


async def test_an_end_is_loaded_when_the_node_starts_again(tmp_path: Path) -> None:
    async with admin_node(tmp_path) as gw:
        await _declare(gw)
        await _publish(gw, 4, gray=True)
        status, ended = await gw.call("POST", END)
        assert status == 202, ended
    async with admin_node(tmp_path) as gw:
        assert _gray_now(gw) == []
        shown = await _shown(gw)
        assert (shown["ended"], shown["gray_now"], shown["set_at"]) == (
            True, [], ended["set_at"]
        )  # fmt: skip
        assert shown["status"]["left"] == 4
        assert await gw.call("POST", END) == (200, ended)
