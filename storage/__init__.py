"""mqgw's log store: one commitlog, per-(queue, partition) consume queues, group offsets.

Public surface (everything else is internal):
- ``StorePort``: the async store API the gateway calls; two implementations:
  ``open_embedded_store(config)`` -> ``EmbeddedStore`` (in-process) and
  ``connect_remote_store("host:port")`` -> ``RemoteStore`` (to `mqgw broker`, which runs
  ``serve_broker``; docs/broker-protocol.md), whose extra error is ``BrokerUnavailable``
- ``LogStore`` (the synchronous core; benchmarks, tools, tests)
- ``StoreConfig``, ``FlushPolicy``; ``Record`` in, ``StoredMessage`` out
- result types and typed errors
- ``check_store`` (log/check.py) and ``repair_store`` (log/repair.py): `mqgw storage check|repair`
"""

from storage.broker.server import serve_broker
from storage.clients.link import BrokerUnavailable
from storage.clients.remote import RemoteStore, connect_remote_store
from storage.config import FlushPolicy, StoreConfig
from storage.errors import (
    CorruptionError,
    DiskFull,
    QueueExists,
    RecordTooLarge,
    StoreClosed,
    StoreError,
    StoreLocked,
    StoreWriteError,
    UnknownQueue,
)
from storage.log.embedded import EmbeddedStore, open_embedded_store
from storage.log.log_store import LogStore
from storage.port import StorePort
from storage.record import Record, StoredMessage
from storage.results import (
    QUEUE_GROUP,
    AppendResult,
    DeliveryProgress,
    PartitionStats,
    QueueStats,
    ReadResult,
    ReadStatus,
    RecoveryReport,
    RetentionReport,
)

__all__ = [
    "QUEUE_GROUP",
    "AppendResult",
    "BrokerUnavailable",
    "CorruptionError",
    "DeliveryProgress",
    "DiskFull",
    "EmbeddedStore",
    "FlushPolicy",
    "LogStore",
    "PartitionStats",
    "QueueExists",
    "QueueStats",
    "ReadResult",
    "ReadStatus",
    "Record",
    "RecordTooLarge",
    "RecoveryReport",
    "RemoteStore",
    "RetentionReport",
    "StoreClosed",
    "StoreConfig",
    "StoreError",
    "StoreLocked",
    "StorePort",
    "StoreWriteError",
    "StoredMessage",
    "UnknownQueue",
    "connect_remote_store",
    "open_embedded_store",
    "serve_broker",
]
