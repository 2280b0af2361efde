"""Just enough of RocketMQ's remoting protocol to ask a name server who serves what.

mqadmin answers the same, but it is a JVM: seconds per question, too slow to poll for a
failover. A frame is ``total length | serialize type << 24 | header length | JSON header |
body``, all lengths big-endian 32-bit; the body of GET_BROKER_CLUSTER_INFO is fastjson, whose
maps keyed by broker id have bare numbers as keys.
"""

from __future__ import annotations

import itertools
import json
import socket
from dataclasses import dataclass
from typing import Any

from storage.rocketmq.remoting import Command, FrameReader, ProtocolError, encode, loads

GET_ALL_TOPIC_CONFIG = 21
UPDATE_BROKER_CONFIG = 25  # body: properties to set ("key=value" lines)
GET_BROKER_CLUSTER_INFO = 106
CONTROLLER_GET_SYNC_STATE_DATA = 1006
_SUCCESS = 0
_opaque = itertools.count(1)


class RemotingError(Exception):
    pass


def request(address: str, code: int, body: bytes = b"", timeout_s: float = 2.0) -> bytes:
    """Send request ``code`` (no header fields) to ``host:port``; the response body.
    RemotingError if it cannot be had or is not a success. Blocking, one connection a call:
    the codec is the gateway's (storage/rocketmq/remoting.py), the I/O a plain socket."""
    host, port = address.rsplit(":", 1)
    reader = FrameReader()
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s) as sock:
            sock.sendall(encode(Command(code, opaque=next(_opaque), body=body)))
            replies: list[Command] = []
            while not replies:
                chunk = sock.recv(1 << 16)
                if not chunk:
                    raise RemotingError(f"{address}: connection closed mid-frame")
                replies = reader.feed(chunk)
    except (OSError, ProtocolError) as error:
        raise RemotingError(f"{address}: {error}") from None
    reply = replies[0]
    if reply.code != _SUCCESS:
        raise RemotingError(f"{address}: code {reply.code}: {reply.remark}")
    return bytes(reply.body)


def fastjson(body: bytes) -> Any:
    """Parse fastjson's output: JSON but for bare integer map keys."""
    return loads(body)


@dataclass(frozen=True)
class BrokerEntry:
    cluster: str
    broker_name: str
    broker_id: int  # 0: the master
    address: str

    @property
    def role(self) -> str:
        return "master" if self.broker_id == 0 else "slave"


def cluster_info(namesrv: str, timeout_s: float = 2.0) -> list[BrokerEntry]:
    """Every broker the name server has registered, masters first."""
    table = fastjson(request(namesrv, GET_BROKER_CLUSTER_INFO, timeout_s=timeout_s))
    entries = []
    for name, data in (table.get("brokerAddrTable") or {}).items():
        for broker_id, address in (data.get("brokerAddrs") or {}).items():
            entries.append(BrokerEntry(data.get("cluster", ""), name, int(broker_id), address))
    return sorted(entries, key=lambda e: (e.broker_name, e.broker_id))


@dataclass(frozen=True)
class SyncState:
    """A broker group as the controller has it (mqadmin getSyncStateSet)."""

    master_address: str
    master_epoch: int
    in_sync: frozenset[str]  # addresses: who may be elected, and whom a send waits for
    not_in_sync: frozenset[str]


def sync_state(controller: str, broker_name: str, timeout_s: float = 2.0) -> SyncState | None:
    """The controller's record of ``broker_name``, or None if it has none yet."""
    body = json.dumps([broker_name]).encode()
    table = fastjson(request(controller, CONTROLLER_GET_SYNC_STATE_DATA, body, timeout_s))
    info = (table.get("replicasInfoTable") or {}).get(broker_name)
    if not info:
        return None

    def addresses(key: str) -> frozenset[str]:
        return frozenset(r["brokerAddress"] for r in info.get(key) or [])

    return SyncState(
        info.get("masterAddress") or "",
        int(info.get("masterEpoch") or 0),
        addresses("inSyncReplicas"),
        addresses("notInSyncReplicas"),
    )
