"""Partitions per queue on a real gateway (node default 2): x-mqgw-partitions, the policy key
``partitions``, gray partitions, and their refusals over AMQP, the admin API and a definitions
import; /api/queues shows both counts."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pika.exceptions
import pytest

from localcluster.ports import free_port
from tests.harness.processes import GatewayProcess

NODE_DEFAULT = 2


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    data: Path = tmp_path_factory.mktemp("partitions") / "data"
    args = ["--admin-port", str(free_port()), "--queue-partitions", str(NODE_DEFAULT)]
    process = GatewayProcess(data, args).start()
    yield process
    process.stop()


def declare(gw: GatewayProcess, name: str, **kwargs: Any) -> None:
    with pika.BlockingConnection(pika.URLParameters(gw.url)) as conn:
        conn.channel().queue_declare(name, **kwargs)


def declare_error(gw: GatewayProcess, name: str, arguments: dict[str, Any], **kw: Any) -> str:
    with (
        pika.BlockingConnection(pika.URLParameters(gw.url)) as conn,
        pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed,
    ):
        conn.channel().queue_declare(name, arguments=arguments, **kw)
    assert closed.value.reply_code == 406, closed.value
    return str(closed.value.reply_text)


def shown(gw: GatewayProcess, name: str) -> dict[str, Any]:
    status, body = gw.admin("GET", f"/api/queues/%2F/{name}")
    assert status == 200, body
    entry: dict[str, Any] = body
    return entry


def put_policy(gw: GatewayProcess, name: str, pattern: str, definition: dict[str, Any]) -> Any:
    body = {"pattern": pattern, "definition": definition, "apply-to": "queues"}
    return gw.admin("PUT", f"/api/policies/%2F/{name}", body)


def test_argument_sets_the_partitions_in_the_store(gw: GatewayProcess) -> None:
    declare(gw, "four", arguments={"x-mqgw-partitions": 4})
    declare(gw, "plain")
    with pika.BlockingConnection(pika.URLParameters(gw.url)) as conn:
        for _ in range(4):  # each channel sticks to a partition
            ch = conn.channel()
            ch.confirm_delivery()
            for i in range(5):
                ch.basic_publish("", "four", b"m%d" % i)
    four = shown(gw, "four")
    assert (four["partitions"], four["gray_partitions"]) == (4, 0)
    details = four["mqgw"]["partition_details"]  # read from the store
    assert [p["partition"] for p in details] == [0, 1, 2, 3]
    assert sum(p["max_offset"] for p in details) == 20 == four["messages"]
    plain = shown(gw, "plain")
    assert plain["partitions"] == NODE_DEFAULT
    assert len(plain["mqgw"]["partition_details"]) == NODE_DEFAULT
    rows = {q["name"]: q for q in gw.admin("GET", "/api/queues")[1]}
    assert (rows["four"]["partitions"], rows["plain"]["partitions"]) == (4, NODE_DEFAULT)


def test_policy_gives_the_count_at_creation_only(gw: GatewayProcess) -> None:
    assert put_policy(gw, "three", r"^bypolicy\.", {"partitions": 3})[0] == 201
    declare(gw, "bypolicy.a")
    declare(gw, "bypolicy.b", arguments={"x-mqgw-partitions": 5})  # the argument wins
    assert shown(gw, "bypolicy.a")["partitions"] == 3
    assert shown(gw, "bypolicy.b")["partitions"] == 5
    declare(gw, "late.q")
    assert put_policy(gw, "six", r"^late\.", {"partitions": 6})[0] == 201
    declare(gw, "late.q")  # a redeclare keeps it too
    late = shown(gw, "late.q")
    assert (late["policy"], late["partitions"]) == ("six", NODE_DEFAULT)
    assert len(late["mqgw"]["partition_details"]) == NODE_DEFAULT


def test_redeclare_with_other_partitions_is_refused(gw: GatewayProcess) -> None:
    declare(gw, "fixed", arguments={"x-mqgw-partitions": 4})
    text = declare_error(gw, "fixed", {"x-mqgw-partitions": 8})
    assert "inequivalent arg 'x-mqgw-partitions' for queue 'fixed' in vhost '/'" in text
    assert shown(gw, "fixed")["partitions"] == 4


@pytest.mark.parametrize(
    ("value", "term"),
    [(0, "{value_zero,0}"), (257, "{value_too_large,257,256}"),
     ("4", '"expected integer, got longstr"')],
)  # fmt: skip
def test_bad_partitions_are_refused(gw: GatewayProcess, value: Any, term: str) -> None:
    text = declare_error(gw, "bad", {"x-mqgw-partitions": value})
    prefix = "PRECONDITION_FAILED - invalid arg 'x-mqgw-partitions' for queue 'bad' in vhost '/'"
    assert text == f"{prefix}: {term}"
    assert gw.admin("GET", "/api/queues/%2F/bad")[0] == 404


def test_gray_partitions_at_declare(gw: GatewayProcess) -> None:
    text = declare_error(gw, "g", {"x-mqgw-partitions": 2, "x-mqgw-gray-partitions": 2})
    needs = "x-mqgw-gray-partitions 2 needs more than 2 partitions (x-mqgw-partitions)"
    assert text.endswith(needs)
    fifo_only = "gray partitions need a classic FIFO queue"
    four_gray = {"x-mqgw-partitions": 4, "x-mqgw-gray-partitions": 1}
    assert fifo_only in declare_error(gw, "g", {**four_gray, "x-max-priority": 5})
    assert fifo_only in declare_error(gw, "g", {**four_gray, "x-single-active-consumer": True})
    stream = {"x-queue-type": "stream", "x-mqgw-gray-partitions": 1}
    assert fifo_only in declare_error(gw, "g", stream, durable=True)
    declare(gw, "gray", arguments={"x-mqgw-partitions": 4, "x-mqgw-gray-partitions": 2})
    gray = shown(gw, "gray")
    assert (gray["partitions"], gray["gray_partitions"]) == (4, 2)


@pytest.mark.parametrize(
    "definition",
    [{"gray-partitions": -1}, {"gray-partitions": "x"}, {"partitions": 0},
     {"gray-partitions": 1, "partitions": 1}],
)  # fmt: skip
def test_policy_with_bad_partition_keys_is_400(
    gw: GatewayProcess, definition: dict[str, Any]
) -> None:
    status, body = put_policy(gw, "bad", "^nothing-here$", definition)
    assert status == 400, body
    assert "partitions" in body["reason"]
    assert "bad" not in {p["name"] for p in gw.admin("GET", "/api/policies")[1]}


def test_policy_gray_must_fit_the_queues_it_matches(gw: GatewayProcess) -> None:
    declare(gw, "grayfit", arguments={"x-mqgw-partitions": 4})
    too_many = {"gray-partitions": 4, "partitions": 8}
    status, body = put_policy(gw, "gray4", "^grayfit$", too_many)
    assert status == 400, body
    assert "4 partitions of queue 'grayfit'" in body["reason"]
    assert shown(gw, "grayfit")["gray_partitions"] == 0
    assert put_policy(gw, "gray2", "^grayfit$", {"gray-partitions": 2})[0] == 201
    assert shown(gw, "grayfit")["gray_partitions"] == 2  # the policy's, as the runtime has it


def test_http_declare_and_import_follow_the_same_rules(gw: GatewayProcess) -> None:
    body = {"durable": True, "arguments": {"x-mqgw-partitions": 0}}
    status, answer = gw.admin("PUT", "/api/queues/%2F/http0", body)
    assert status == 400, answer
    assert "invalid arg 'x-mqgw-partitions'" in answer["reason"]
    body = {"durable": True, "arguments": {"x-mqgw-partitions": 3}}
    assert gw.admin("PUT", "/api/queues/%2F/http3", body)[0] == 201
    assert shown(gw, "http3")["partitions"] == 3
    queue = {"name": "imported", "vhost": "/", "durable": True, "auto_delete": False}
    refused = {**queue, "arguments": {"x-mqgw-partitions": 0}}
    status, answer = gw.admin("POST", "/api/definitions", {"queues": [refused]})
    assert status == 400, answer
    accepted = {**queue, "arguments": {"x-mqgw-partitions": 6}}
    assert gw.admin("POST", "/api/definitions", {"queues": [accepted]})[0] in (200, 201, 204)
    assert shown(gw, "imported")["partitions"] == 6
    plain = {**queue, "name": "imported-plain", "arguments": {}}
    assert gw.admin("POST", "/api/definitions", {"queues": [plain]})[0] in (200, 201, 204)
    assert shown(gw, "imported-plain")["partitions"] == NODE_DEFAULT
