"""What an embedded node had delivered and not settled when it stopped cleanly, kept for its
next start: the redelivered flag RabbitMQ sets on such a message.

A crash leaves the store's unclean marks (everything stored may have gone out: storage
``unclean_marks``). A clean stop leaves none, and the stop requeues what the closed
connections held before committing, so the committed offsets alone do not tell a message
that went out from one that never did: RabbitMQ says redelivered=True for the first and False
for the second. Per queue partition the runtime knows an offset below which a message may
have gone out (``QueueRuntime.delivery_marks``: past the highest delivered, or a mark
carried from the start before); the node writes them at its clean stop and reads them once
at its next start, before any delivery.

A mark only ever says "below here a message may have been delivered" (true for good), so a
file left over by a crash after it was read flags no more than the crash's own marks do.
Cluster gateways keep no file: a gateway that gives a partition's delivery lease up leaves the
same mark in Redis for the next holder (QueueRuntime.hand_over, take_over).
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from storage.log.file_system import FileSystem

if TYPE_CHECKING:
    from gateway.queues.runtime import QueueRuntime

log = logging.getLogger("mqgw.queue")

FILE_NAME = "delivered-marks.json"
_FILES = FileSystem()  # the store's atomic write and directory fsync


def save(data_dir: Path, queues: Iterable[QueueRuntime]) -> None:
    """Write the queues' marks (atomically, fsynced) for the next start."""
    marks = {
        f"{queue.queue_id}/{partition}": mark
        for queue in queues
        for partition, mark in queue.delivery_marks().items()
    }
    try:
        _FILES.write_atomic(data_dir / FILE_NAME, json.dumps(marks, sort_keys=True).encode())
    except OSError as error:  # a full disk: the next start flags these messages False
        log.warning("could not keep what was delivered unacked for the next start: %s", error)


def load(data_dir: Path) -> dict[tuple[int, int], int]:
    """The marks the last clean stop wrote, (queue id, partition) -> offset; the file goes
    (a later start reads the store's crash marks, or the marks of a later stop)."""
    path = data_dir / FILE_NAME
    try:
        document = json.loads(path.read_bytes())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as error:
        log.warning("ignoring %s: %s", path, error)
        document = {}
    with contextlib.suppress(OSError):
        path.unlink()
        _FILES.fsync_dir(data_dir)
    marks: dict[tuple[int, int], int] = {}
    for key, mark in document.items() if isinstance(document, dict) else ():
        queue_id, _, partition = str(key).partition("/")
        with contextlib.suppress(ValueError, TypeError):
            marks[int(queue_id), int(partition)] = int(mark)
    return marks


def apply(marks: dict[tuple[int, int], int], queues: Iterable[QueueRuntime]) -> None:
    """Flag redelivered, on the started ``queues``, what lies below their marks."""
    for queue in queues:
        for partition in range(queue.partitions):
            mark = marks.get((queue.queue_id, partition), 0)
            queue.maybe_delivered[partition] = max(queue.maybe_delivered[partition], mark)
