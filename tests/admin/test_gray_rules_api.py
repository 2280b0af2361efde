"""/api/gray/rules on a real embedded node (tests/admin/gray_node.py): PUT creates (201) and
replaces (204) with a server-set set_at, GET shows a rule with this gateway's status, DELETE
removes it once; bad bodies are 400s in RabbitMQ's shape, a call without credentials a 401,
a monitoring user reads but does not change; the node's registry follows every change, and
the rules are loaded again when the node starts on the same data."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from meta.models import GrayMatch, GrayRule
from tests.admin.gray_node import WATCHER, admin_node, recent

pytestmark = pytest.mark.anyio
PATH = "/api/gray/rules/canary"
BODY: dict[str, Any] = {"match": {"connection_name": "billing-canary-*"}, "gray": True}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # uvicorn


async def test_create_replace_show_list_and_delete(tmp_path: Path) -> None:
    async with admin_node(tmp_path) as gw:
        assert await gw.call("GET", "/api/gray/rules") == (200, [])
        assert await gw.call("PUT", PATH, BODY) == (201, None)
        status, shown = await gw.call("GET", PATH)
        assert status == 200, shown
        assert recent(shown.pop("set_at"))
        assert shown == {
            "name": "canary",
            "match": {"connection_name": "billing-canary-*", "user": None, "address": None},
            "gray": True,
            "switch": None,
            "drain": False,
            "status": gw.node.gray.status("canary"),
        }
        assert isinstance(shown["status"], dict)
        assert set(gw.node.gray.rules) == {"canary"}
        assert gw.node.gray.rules["canary"].match == GrayMatch(connection_name="billing-canary-*")

        off = {"match": {"user": "alice", "address": "10.1.0.0/16"}, "gray": False}
        assert await gw.call("PUT", PATH, {**off, "switch": False, "drain": True}) == (204, None)
        rule = gw.node.gray.rules["canary"]
        expected = GrayRule(
            name="canary",
            match=GrayMatch(user="alice", address="10.1.0.0/16"),
            gray=False,
            switch=False,
            drain=True,
            set_at=rule.set_at,
        )
        assert rule == expected and recent(rule.set_at)
        assert await gw.node.meta.get_gray_rule("canary") == expected
        assert await gw.call(
            "PUT", "/api/gray/rules/v6", {"match": {"address": "::1"}, "gray": True}
        )
        status, listed = await gw.call("GET", "/api/gray/rules")
        assert status == 200
        assert [r["name"] for r in listed] == ["canary", "v6"]
        assert listed[0] == expected.model_dump()

        assert await gw.call("DELETE", PATH) == (204, None)
        assert "canary" not in gw.node.gray.rules
        assert await gw.node.meta.get_gray_rule("canary") is None
        for method in ("DELETE", "GET"):
            status, body = await gw.call(method, PATH)
            assert (status, body["error"]) == (404, "not_found")


async def test_set_at_is_the_time_of_each_put(tmp_path: Path) -> None:
    async with admin_node(tmp_path) as gw:
        await gw.call("PUT", PATH, BODY)
        first = gw.node.gray.rules["canary"].set_at
        await anyio.sleep(1.1)  # set_at has whole seconds
        await gw.call("PUT", PATH, BODY)
        assert gw.node.gray.rules["canary"].set_at > first


BAD_BODIES: list[tuple[Any, str]] = [
    ({**BODY, "colour": "grey"}, "colour: Extra inputs are not permitted"),
    ({**BODY, "name": "other"}, "name: Extra inputs are not permitted"),
    ({"match": {"client": "x"}, "gray": True}, "match.client: Extra inputs are not permitted"),
    ({"match": {"address": "10.0.0"}, "gray": True}, "neither an IP address nor a CIDR block"),
    ({"match": {"address": "10.1.2.3/8"}, "gray": True}, "has host bits set"),
    ({"match": {"address": "db-host"}, "gray": True}, "'db-host' is neither an IP address"),
    ({**BODY, "set_at": "2020-01-01T00:00:00Z"}, "set_at is set by the server"),
    ({"gray": True}, "match: Field required"),
    ({"match": {}}, "gray: Field required"),
    ({**BODY, "gray": "yes"}, "gray: Input should be a valid boolean"),
    ({**BODY, "drain": 1}, "drain: Input should be a valid boolean"),
    ({"match": {"user": 7}, "gray": True}, "match.user: Input should be a valid string"),
    ([BODY], "Input should be a valid dictionary"),
    (b'{"match": {"user": "a"}, "gray": tr', "the request body is not valid JSON"),
    (b"", "Field required"),  # no body at all
]


async def test_bad_bodies_are_refused_with_a_reason(tmp_path: Path) -> None:
    async with admin_node(tmp_path) as gw:
        for body, reason in BAD_BODIES:
            status, answer = await gw.call("PUT", PATH, body)
            assert status == 400, (body, answer)
            assert answer["error"] == "bad_request", (body, answer)
            assert reason in answer["reason"], (body, answer)
        assert await gw.node.meta.list_gray_rules() == []
        assert gw.node.gray.rules == {}
        # A form-encoded body (curl -d) is read as JSON, as everywhere in the API.
        status, _ = await gw.call(
            "PUT", PATH, b'{"match": {"address": "10.0.0.0/8"}, "gray": true}'
        )
        assert status == 201


async def test_who_may_read_and_change(tmp_path: Path) -> None:
    async with admin_node(tmp_path) as gw:
        await gw.call("PUT", PATH, BODY)
        for method, path, body in [
            ("GET", "/api/gray/rules", None),
            ("GET", PATH, None),
            ("PUT", PATH, BODY),
            ("DELETE", PATH, None),
        ]:
            status, answer = await gw.call(method, path, body, auth=None)
            assert (status, answer["error"]) == (401, "not_authorized"), (method, path)
            assert (await gw.call(method, path, body, auth=("guest", "wrong")))[0] == 401
        assert (await gw.call("GET", "/api/gray/rules", auth=WATCHER))[0] == 200
        assert (await gw.call("GET", PATH, auth=WATCHER))[0] == 200
        assert (await gw.call("PUT", PATH, {**BODY, "gray": False}, auth=WATCHER))[0] == 403
        assert (await gw.call("DELETE", PATH, auth=WATCHER))[0] == 403
        assert gw.node.gray.rules["canary"].gray


async def test_rules_are_loaded_when_the_node_starts_again(tmp_path: Path) -> None:
    async with admin_node(tmp_path) as gw:
        await gw.call("PUT", PATH, BODY)
        await gw.call("PUT", "/api/gray/rules/gone", BODY)
        await gw.call("DELETE", "/api/gray/rules/gone")
        kept = gw.node.gray.rules["canary"]
    async with admin_node(tmp_path) as gw:
        assert gw.node.gray.rules == {"canary": kept}
        status, listed = await gw.call("GET", "/api/gray/rules")
        assert (status, listed) == (200, [kept.model_dump()])
