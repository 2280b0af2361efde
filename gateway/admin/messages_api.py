"""Publish and get over HTTP, as the management plugin and ``rabbitmqadmin publish/get`` do:
``POST /api/exchanges/{vhost}/{name}/publish`` answers ``{"routed": bool}``;
``POST /api/queues/{vhost}/{name}/get`` takes ``count``, ``ackmode`` (ack_requeue_true,
ack_requeue_false, reject_requeue_true, reject_requeue_false), ``encoding`` (auto, base64)
and ``truncate``, and answers the messages in the plugin's shape.

A get takes the messages as basic.get would, one after the other (so ``message_count`` counts
down), then settles them all as the ackmode says: a requeue puts each back in its place,
flagged redelivered. A publish is one message appended durably before the answer.
"""

from __future__ import annotations

import base64
import binascii
import datetime
import time
from functools import partial
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Depends, HTTPException
from pamqp import commands

from gateway.admin.auth import MANAGEMENT, requires
from gateway.admin.connections_api import json_value
from gateway.admin.paths import SlashRoute
from gateway.admin.queues_api import permit as permit_on
from gateway.admin.queues_api import visible_vhost
from gateway.admin.topology_api import DEFAULT_EXCHANGE_ALIAS, Json
from gateway.amqp.events import decode_properties
from gateway.amqp.property_bytes import timestamp_of
from gateway.features.gray import marked_gray
from meta.models import User
from storage import Record
from storage.record import EXPIRES, PERSISTENT

if TYPE_CHECKING:
    from gateway.node import Node
    from gateway.queues.runtime import QueueRuntime
    from gateway.vhost import VirtualHost

ACK_MODES = ("ack_requeue_true", "ack_requeue_false", "reject_requeue_true", "reject_requeue_false")
# JSON property names (the plugin's) -> pamqp's keyword, where they differ.
_PROPERTY_NAMES = {"type": "message_type"}


def encode_properties(properties: dict[str, Any]) -> tuple[bytes, int]:
    """The AMQP property bytes for the plugin's JSON ``properties``, and the delivery mode."""
    known = set(commands.Basic.Properties.attributes())
    keywords: dict[str, Any] = {}
    for name, value in properties.items():
        keyword = _PROPERTY_NAMES.get(name, name)
        if keyword not in known:
            raise HTTPException(400, f"unknown message property '{name}'")
        if keyword == "timestamp" and isinstance(value, int):
            keywords[keyword] = datetime.datetime.fromtimestamp(value, datetime.UTC)
        else:
            keywords[keyword] = value
    try:
        encoded = commands.Basic.Properties(**keywords).marshal()
    except (TypeError, ValueError) as error:
        raise HTTPException(400, f"invalid message properties: {error}") from None
    return encoded, int(keywords.get("delivery_mode") or 0)


def properties_json(properties: bytes) -> dict[str, Any] | list[Any]:
    """The message's properties; none at all is ``[]``, as the plugin renders an empty
    Erlang property list (rabbitmqadmin then shows an empty ``properties`` column)."""
    decoded = decode_properties(properties)
    result: dict[str, Any] = {}
    for name in decoded.attributes():
        value = getattr(decoded, name)
        if value is None or (value == "" and name == "cluster_id"):
            continue
        if isinstance(value, datetime.datetime):
            value = int(value.timestamp())
        result["type" if name == "message_type" else name] = json_value(value)
    stamp = timestamp_of(properties)  # AMQP's 64-bit integer, also beyond a datetime's range
    if stamp is not None:
        result["timestamp"] = stamp
    return result or []


def payload_json(body: bytes, encoding: str, truncate: int | None) -> dict[str, Any]:
    shown = body if truncate is None else body[:truncate]
    if encoding == "auto":
        try:
            return {"payload": shown.decode("utf-8"), "payload_encoding": "string"}
        except UnicodeDecodeError:
            pass
    return {"payload": base64.b64encode(shown).decode(), "payload_encoding": "base64"}


def _body_of(body: dict[str, Any]) -> bytes:
    payload = body.get("payload")
    if not isinstance(payload, str):
        raise HTTPException(400, "payload (a string) is required")
    encoding = body.get("payload_encoding", "string")
    if encoding == "string":
        return payload.encode()
    if encoding == "base64":
        try:
            return base64.b64decode(payload, validate=True)
        except binascii.Error:
            raise HTTPException(400, "payload is not valid base64") from None
    raise HTTPException(400, f"payload_encoding must be string or base64, not '{encoding}'")


def routes(node: Node) -> APIRouter:
    router = APIRouter(route_class=SlashRoute)
    management = Depends(requires(MANAGEMENT, node))

    vhost_or_404 = partial(visible_vhost, node)
    permit = partial(permit_on, node)

    @router.post("/api/exchanges/{vhost}/{name}/publish", summary="Publish one message")
    async def publish(vhost: str, name: str, body: Json, user: User = management) -> Any:
        host = vhost_or_404(vhost, user)
        exchange = "" if name == DEFAULT_EXCHANGE_ALIAS else name
        if host.router.get_exchange(exchange) is None:  # the plugin's channel error, as a 400
            raise HTTPException(400, f"404 NOT_FOUND - no exchange '{name}' in vhost '{vhost}'")
        permit(user, vhost, "write", exchange)
        routing_key = body.get("routing_key")
        if not isinstance(routing_key, str):
            raise HTTPException(400, "routing_key (a string) is required")
        properties = body.get("properties") or {}
        if not isinstance(properties, dict):
            raise HTTPException(400, "properties must be a JSON object")
        payload = _body_of(body)
        property_bytes, delivery_mode = encode_properties(properties)
        queues = _route(host, exchange, routing_key, properties.get("headers"), property_bytes)
        node.stats.publish += 1
        if not queues:
            node.stats.drop_unroutable += 1
            return {"routed": False}
        flags = (PERSISTENT if delivery_mode == 2 else 0) | (
            EXPIRES if "expiration" in properties else 0
        )
        gray = marked_gray(properties.get("headers"))
        destinations = tuple((q.queue_id, q.pick_partition(gray)) for q in queues)
        now_ms = time.time_ns() // 1_000_000
        record = Record(
            exchange.encode(), routing_key.encode(), property_bytes, payload, destinations,
            now_ms, flags,
        )  # fmt: skip
        await host.append([record], wait_durable=True)
        return {"routed": True}

    @router.post("/api/queues/{vhost}/{name}/get", summary="Get messages (rabbitmqadmin get)")
    async def get(vhost: str, name: str, body: Json, user: User = management) -> Any:
        queue = vhost_or_404(vhost, user).queues.get(name)
        if queue is None:
            raise HTTPException(404, f"no queue '{name}' in vhost '{vhost}'")
        permit(user, vhost, "read", name)
        mode = body.get("ackmode", "ack_requeue_true")
        if mode not in ACK_MODES:
            raise HTTPException(400, f"ackmode must be one of {', '.join(ACK_MODES)}")
        encoding = body.get("encoding", "auto")
        if encoding not in ("auto", "base64"):
            raise HTTPException(400, "encoding must be auto or base64")
        try:
            count = int(body.get("count", 1))
            truncate = None if body.get("truncate") in (None, "") else int(body["truncate"])
        except (TypeError, ValueError):
            raise HTTPException(400, "count and truncate must be integers") from None
        if node.cluster is not None and not await node.cluster.hold_for_get(queue):
            return []  # another gateway delivers this queue now
        return await _take(node, queue, count, mode, encoding, truncate)

    return router


def _route(
    host: VirtualHost, exchange: str, key: str, headers: Any, properties: bytes
) -> list[QueueRuntime]:
    if not exchange:
        queue = host.queues.get(key)
        return [] if queue is None else [queue]
    result = host.router.route(exchange, key, headers if isinstance(headers, dict) else None,
                               properties)  # fmt: skip
    return [host.queues[n] for n in sorted(result.queues) if n in host.queues]


async def _take(
    node: Node, queue: QueueRuntime, count: int, mode: str, encoding: str, truncate: int | None
) -> list[dict[str, Any]]:
    taken = []
    answers = []
    for _ in range(max(0, count)):
        item = await queue.get()
        if item is None:
            break
        partition, message, redelivered = item
        queue.delivered += 1
        node.stats.count_get(False, redelivered)
        taken.append((partition, message))
        answers.append(
            {
                "payload_bytes": len(message.body),
                "redelivered": redelivered,
                "exchange": message.exchange.decode(),
                "routing_key": message.routing_key.decode(),
                "message_count": await queue.message_count(),
                "properties": properties_json(bytes(message.properties)),
                **payload_json(bytes(message.body), encoding, truncate),
            }
        )
    if not taken:
        node.stats.get_empty += 1
    for partition, message in taken:
        if mode.endswith("requeue_true"):
            queue.requeue(partition, message)
        elif mode.startswith("ack"):
            node.stats.ack += 1
            queue.settle(partition, message)
        else:
            queue.reject(partition, message)
    if taken and mode.endswith("requeue_true") and queue.consumers:
        node.scheduler.wake(queue)
    return answers
