"""The RocketMQ calls the store makes: routes from the name servers, topics and groups by
admin command, batched sends, pulls by offset and consumer offsets on the brokers.

Each method is one remoting round trip (``route`` may try several name servers); errors
are ``RocketMQError`` with RocketMQ's response code, or BrokerUnavailable when nobody
answered. Nothing here knows AMQP or mqgw's queues (storage/rocketmq/store.py maps them).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Sequence
from typing import NamedTuple

from storage.clients.link import BrokerUnavailable
from storage.errors import StoreError
from storage.rocketmq.connection import Pool
from storage.rocketmq.remoting import Command, loads, request

# Request codes (RocketMQ's RequestCode).
PULL_MESSAGE = 11
QUERY_CONSUMER_OFFSET = 14
UPDATE_CONSUMER_OFFSET = 15
UPDATE_AND_CREATE_TOPIC = 17
GET_BROKER_CONFIG = 26
SEARCH_OFFSET_BY_TIMESTAMP = 29
GET_MAX_OFFSET = 30
GET_MIN_OFFSET = 31
GET_ROUTEINFO_BY_TOPIC = 105
GET_ALL_TOPIC_LIST_FROM_NAMESERVER = 206
GET_BROKER_CLUSTER_INFO = 106
UPDATE_AND_CREATE_SUBSCRIPTIONGROUP = 200
DELETE_TOPIC_IN_BROKER = 215
DELETE_TOPIC_IN_NAMESRV = 216
SEND_BATCH_MESSAGE = 320
# Response codes (ResponseCode).
SUCCESS = 0
SYSTEM_BUSY = 2
FLUSH_DISK_TIMEOUT = 10
SLAVE_NOT_AVAILABLE = 11
FLUSH_SLAVE_TIMEOUT = 12
SERVICE_NOT_AVAILABLE = 14
NO_PERMISSION = 16
TOPIC_NOT_EXIST = 17
PULL_NOT_FOUND = 19
PULL_RETRY_IMMEDIATELY = 20
PULL_OFFSET_MOVED = 21
QUERY_NOT_FOUND = 22
# PullSysFlag: the subscription travels with the pull (no consumer registration needed);
# suspend: the broker holds the pull until messages arrive or the timeout passes.
PULL_SUSPEND = 2
PULL_SUBSCRIPTION = 4
PERM_READ_WRITE = 6
PRODUCER_GROUP = "mqgw_gateway"


class RocketMQError(StoreError):
    def __init__(self, what: str, code: int, remark: str | None) -> None:
        super().__init__(f"rocketmq {what}: code {code}: {remark or ''}".rstrip(": "))
        self.code = code
        self.remark = remark or ""


class Route(NamedTuple):
    broker: str  # the master's address of the broker holding the topic
    broker_name: str
    queues: int
    topic: str


class Pulled(NamedTuple):
    code: int
    next_offset: int
    min_offset: int
    max_offset: int
    body: bytes | memoryview


def send_header(
    topic: str, queue_id: int, born_ts_ms: int, batch: bool, properties: str = ""
) -> dict[str, object]:
    """A send's request header (SendMessageRequestHeaderV2's one-letter fields); a batch
    carries each message's properties in its body instead."""
    return {"a": PRODUCER_GROUP, "b": topic, "c": "TBW102", "d": 4, "e": queue_id, "f": 0,
            "g": born_ts_ms, "h": 0, "i": properties, "j": 0, "k": False, "m": batch}  # fmt: skip


class RocketMQClient:
    def __init__(self, pool: Pool, namesrvs: Sequence[str], timeout_s: float = 5.0) -> None:
        self.pool = pool
        self.namesrvs = list(namesrvs)
        self.timeout_s = timeout_s

    async def _call(
        self,
        address: str,
        command: Command,
        what: str,
        timeout_s: float | None = None,
        ok: tuple[int, ...] = (SUCCESS,),
    ) -> Command:
        response = await self.pool.to(address).call(command, timeout_s or self.timeout_s)
        if response.code not in ok:
            raise RocketMQError(what, response.code, response.remark)
        return response

    async def _namesrv(
        self, command: Command, what: str, ok: tuple[int, ...] = (SUCCESS,)
    ) -> Command:
        """The first name server that answers (they hold the same routes)."""
        failure: BrokerUnavailable | None = None
        for address in self.namesrvs:
            try:
                return await self._call(address, command, what, ok=ok)
            except BrokerUnavailable as error:
                failure = error
        assert failure is not None
        raise failure

    # -- cluster and routes -------------------------------------------------------------

    async def groups(self) -> dict[str, list[str]]:
        """Broker name -> the addresses of its brokers, by broker id (0, the master, first
        when there is one)."""
        response = await self._namesrv(request(GET_BROKER_CLUSTER_INFO), "cluster info")
        info = loads(response.body)
        found: dict[str, list[str]] = {}
        for name, data in (info.get("brokerAddrTable") or {}).items():
            addresses = data.get("brokerAddrs") or {}
            found[name] = [addresses[i] for i in sorted(addresses, key=int)]
        return found

    async def masters(self) -> dict[str, str]:
        """Broker name -> its master's address, for every broker group with a master."""
        response = await self._namesrv(request(GET_BROKER_CLUSTER_INFO), "cluster info")
        info = loads(response.body)
        found: dict[str, str] = {}
        for name, data in (info.get("brokerAddrTable") or {}).items():
            master = (data.get("brokerAddrs") or {}).get("0")
            if master:
                found[name] = master
        return found

    async def route(self, topic: str) -> Route | None:
        """Where ``topic`` lives (None: the name servers do not know it)."""
        response = await self._namesrv(
            request(GET_ROUTEINFO_BY_TOPIC, {"topic": topic}),
            f"route of {topic}",
            ok=(SUCCESS, TOPIC_NOT_EXIST),
        )
        if response.code == TOPIC_NOT_EXIST or not response.body:
            return None
        data = loads(response.body)
        masters = {
            b["brokerName"]: (b.get("brokerAddrs") or {}).get("0")
            for b in data.get("brokerDatas") or []
        }
        for queue in data.get("queueDatas") or []:
            master = masters.get(queue["brokerName"])
            if master:
                return Route(master, queue["brokerName"], int(queue["readQueueNums"]), topic)
        return None

    async def topic_names(self) -> list[str]:
        """Every topic the name servers know (names only: cheap with thousands)."""
        response = await self._namesrv(request(GET_ALL_TOPIC_LIST_FROM_NAMESERVER), "topics")
        return list(loads(response.body).get("topicList") or [])

    # -- admin ---------------------------------------------------------------------------

    async def create_topic(self, broker: str, topic: str, queues: int) -> None:
        fields = {
            "topic": topic,
            "defaultTopic": "TBW102",
            "readQueueNums": queues,
            "writeQueueNums": queues,
            "perm": PERM_READ_WRITE,
            "topicFilterType": "SINGLE_TAG",
            "topicSysFlag": 0,
            "order": False,
        }
        await self._call(broker, request(UPDATE_AND_CREATE_TOPIC, fields), f"create {topic}")

    async def broker_config(self, broker: str) -> dict[str, str]:
        """The broker's settings as it runs with them (a Java properties text)."""
        response = await self._call(broker, request(GET_BROKER_CONFIG), "broker config")
        text = bytes(response.body).decode("utf-8", "replace")
        pairs = (line.split("=", 1) for line in text.splitlines() if "=" in line)
        return {key.strip(): value.strip() for key, value in pairs}

    async def delete_topic(self, broker: str, topic: str) -> None:
        await self._call(
            broker, request(DELETE_TOPIC_IN_BROKER, {"topic": topic}), f"delete {topic}"
        )
        for address in self.namesrvs:  # each keeps its own route table
            # One that does not answer drops the route when the broker registers again.
            with contextlib.suppress(BrokerUnavailable):
                await self._call(
                    address,
                    request(DELETE_TOPIC_IN_NAMESRV, {"topic": topic}),
                    f"unregister {topic}",
                )

    async def create_group(self, broker: str, group: str) -> None:
        config = {
            "groupName": group,
            "consumeEnable": True,
            "consumeFromMinEnable": True,
            "consumeBroadcastEnable": True,
            "retryQueueNums": 1,
            "retryMaxTimes": 16,
            "brokerId": 0,
            "whichBrokerWhenConsumeSlowly": 1,
            "notifyConsumerIdsChangedEnable": False,
        }
        body = json.dumps(config).encode()
        await self._call(
            broker, request(UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, body=body), f"create group {group}"
        )

    # -- messages ------------------------------------------------------------------------

    async def send_batch(
        self, broker: str, topic: str, queue_id: int, body: bytes, born_ts_ms: int
    ) -> tuple[int, list[int]]:
        """One batch into one message queue: (queue offset of its first message, each
        message's commitlog offset)."""
        fields = send_header(topic, queue_id, born_ts_ms, batch=True)
        response = await self._call(
            broker, request(SEND_BATCH_MESSAGE, fields, body), f"send to {topic}/{queue_id}"
        )
        ids = response.fields.get("msgId", "")
        offsets = [int(one[-16:], 16) for one in ids.split(",") if one]
        return int(response.fields["queueOffset"]), offsets

    async def pull(
        self,
        broker: str,
        group: str,
        topic: str,
        queue_id: int,
        offset: int,
        max_count: int,
        max_bytes: int,
        wait_ms: int,
    ) -> Pulled:
        flags = PULL_SUBSCRIPTION | (PULL_SUSPEND if wait_ms > 0 else 0)
        fields = {
            "consumerGroup": group,
            "topic": topic,
            "queueId": queue_id,
            "queueOffset": offset,
            "maxMsgNums": max_count,
            "sysFlag": flags,
            "commitOffset": 0,
            "suspendTimeoutMillis": wait_ms,
            "subscription": "*",
            "subVersion": 0,
            "expressionType": "TAG",
            "maxMsgBytes": max_bytes,
        }
        response = await self._call(
            broker,
            request(PULL_MESSAGE, fields),
            f"pull {topic}/{queue_id}",
            timeout_s=self.timeout_s + wait_ms / 1000,
            ok=(SUCCESS, PULL_NOT_FOUND, PULL_RETRY_IMMEDIATELY, PULL_OFFSET_MOVED),
        )
        f = response.fields
        return Pulled(
            response.code,
            int(f.get("nextBeginOffset", offset)),
            int(f.get("minOffset", 0)),
            int(f.get("maxOffset", 0)),
            response.body,
        )

    async def _offset(
        self,
        code: int,
        broker: str,
        topic: str,
        queue_id: int,
        extra: dict[str, object] | None = None,
    ) -> int:
        fields: dict[str, object] = {"topic": topic, "queueId": queue_id, **(extra or {})}
        response = await self._call(broker, request(code, fields), f"offset of {topic}/{queue_id}")
        return int(response.fields["offset"])

    async def max_offset(self, broker: str, topic: str, queue_id: int) -> int:
        return await self._offset(GET_MAX_OFFSET, broker, topic, queue_id)

    async def min_offset(self, broker: str, topic: str, queue_id: int) -> int:
        return await self._offset(GET_MIN_OFFSET, broker, topic, queue_id)

    async def offset_for_time(self, broker: str, topic: str, queue_id: int, ts_ms: int) -> int:
        extra = {"timestamp": ts_ms, "boundaryType": "LOWER"}
        return await self._offset(SEARCH_OFFSET_BY_TIMESTAMP, broker, topic, queue_id, extra)

    async def group_offset(self, broker: str, group: str, topic: str, queue_id: int) -> int | None:
        """The group's committed offset (None: it never committed there)."""
        fields = {
            "consumerGroup": group,
            "topic": topic,
            "queueId": queue_id,
            "setZeroIfNotFound": False,
        }
        response = await self._call(
            broker,
            request(QUERY_CONSUMER_OFFSET, fields),
            f"offset of {group} on {topic}/{queue_id}",
            ok=(SUCCESS, QUERY_NOT_FOUND),
        )
        if response.code == QUERY_NOT_FOUND:
            return None
        return int(response.fields["offset"])

    async def commit_group_offset(
        self, broker: str, group: str, topic: str, queue_id: int, offset: int
    ) -> None:
        fields = {
            "consumerGroup": group,
            "topic": topic,
            "queueId": queue_id,
            "commitOffset": offset,
        }
        await self._call(
            broker, request(UPDATE_CONSUMER_OFFSET, fields), f"commit {group} on {topic}/{queue_id}"
        )
