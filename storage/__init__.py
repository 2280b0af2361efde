"""mqgw's log store: one commitlog, per-(queue, partition) consume queues, group offsets.

Public surface (everything else is internal):
- ``open_embedded_store(config)`` -> ``EmbeddedStore`` (async; what the gateway uses)
- ``LogStore`` (the synchronous core; benchmarks, tools, tests)
- ``StoreConfig``, ``FlushPolicy``; ``Record`` in, ``StoredMessage`` out
- result types and typed errors
- ``check_store`` / ``repair_store`` for `mqgw storage check|repair`
"""

from storage.config import FlushPolicy, StoreConfig
from storage.embedded import EmbeddedStore, open_embedded_store
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
from storage.log_store import LogStore
from storage.record import Record, StoredMessage
from storage.results import (
    QUEUE_GROUP,
    AppendResult,
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
    "CorruptionError",
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
    "RetentionReport",
    "StoreClosed",
    "StoreConfig",
    "StoreError",
    "StoreLocked",
    "StoreWriteError",
    "StoredMessage",
    "UnknownQueue",
    "open_embedded_store",
]
