"""Errors over the broker protocol: the store's typed errors travel as (code, message,
constructor args) in an ERROR frame and are raised on the client as the same class, with the
same message and attributes (queue_id, errno, size_bytes...)."""

from __future__ import annotations

import struct
from collections.abc import Callable
from enum import IntEnum
from typing import Any

from storage.errors import (
    CorruptionError,
    DiskFull,
    NotMaster,
    QueueExists,
    RecordTooLarge,
    StaleFence,
    StoreClosed,
    StoreError,
    StoreLocked,
    StoreWriteError,
    UnknownQueue,
)
from storage.wire.frames import I64, U8, PayloadReader, ProtocolError, build_frame, pack_text

ERROR_OP = 255  # the op of an error answer (wire.Op.ERROR)


class ErrorCode(IntEnum):
    STORE_ERROR = 1
    RECORD_TOO_LARGE = 2
    STORE_WRITE_ERROR = 3
    DISK_FULL = 4
    UNKNOWN_QUEUE = 5
    QUEUE_EXISTS = 6
    STORE_CLOSED = 7
    CORRUPTION = 8
    STORE_LOCKED = 9
    INVALID_ARGUMENT = 10  # ValueError: an argument out of range (partitions 0, say)
    NOT_MASTER = 11  # a replicated broker that does not confirm now: try the master
    STALE_FENCE = 12  # an offset commit from a delivery lease holder that was replaced


_CLASSES: dict[int, Callable[..., Exception]] = {
    ErrorCode.RECORD_TOO_LARGE: RecordTooLarge,
    ErrorCode.DISK_FULL: DiskFull,
    ErrorCode.STORE_WRITE_ERROR: StoreWriteError,
    ErrorCode.UNKNOWN_QUEUE: UnknownQueue,
    ErrorCode.QUEUE_EXISTS: QueueExists,
    ErrorCode.STORE_CLOSED: StoreClosed,
    ErrorCode.CORRUPTION: CorruptionError,
    ErrorCode.STORE_LOCKED: StoreLocked,
    ErrorCode.INVALID_ARGUMENT: ValueError,
    ErrorCode.NOT_MASTER: NotMaster,
    ErrorCode.STALE_FENCE: StaleFence,
    ErrorCode.STORE_ERROR: StoreError,
}
# Classes rebuilt from their message alone, most specific first.
_BY_MESSAGE = (
    (QueueExists, ErrorCode.QUEUE_EXISTS),
    (NotMaster, ErrorCode.NOT_MASTER),
    (StaleFence, ErrorCode.STALE_FENCE),
    (StoreClosed, ErrorCode.STORE_CLOSED),
    (StoreLocked, ErrorCode.STORE_LOCKED),
    (ValueError, ErrorCode.INVALID_ARGUMENT),
    (StoreError, ErrorCode.STORE_ERROR),
)
_ARG_NONE, _ARG_INT, _ARG_TEXT = 0, 1, 2


def error_args(error: BaseException) -> tuple[ErrorCode, str, tuple[object, ...]]:
    """(code, message, constructor args) of an exception: decode_error calls the class of the
    code with the args, so the client gets the class, message and attributes the store gave.
    Anything unexpected travels as a plain StoreError naming it (the broker logs it)."""
    message = str(error)
    if isinstance(error, RecordTooLarge):
        return ErrorCode.RECORD_TOO_LARGE, message, (error.size_bytes, error.max_bytes)
    if isinstance(error, StoreWriteError):  # DiskFull included
        code = ErrorCode.DISK_FULL if isinstance(error, DiskFull) else ErrorCode.STORE_WRITE_ERROR
        return code, message, (message, error.errno)
    if isinstance(error, UnknownQueue):
        return ErrorCode.UNKNOWN_QUEUE, message, (error.queue_id, error.partition)
    if isinstance(error, CorruptionError):
        return ErrorCode.CORRUPTION, message, (error.segment, error.offset, error.reason)
    for kind, code in _BY_MESSAGE:
        if isinstance(error, kind):
            return code, message, (message,)
    message = f"broker internal error: {error!r}"
    return ErrorCode.STORE_ERROR, message, (message,)


def encode_error(request_id: int, error: BaseException) -> bytes:
    code, message, args = error_args(error)
    parts: list[Any] = [b"", U8.pack(code), pack_text(message), U8.pack(len(args))]
    for arg in args:
        if arg is None:
            parts.append(U8.pack(_ARG_NONE))
        elif isinstance(arg, int):
            parts += (U8.pack(_ARG_INT), I64.pack(arg))
        else:
            parts += (U8.pack(_ARG_TEXT), pack_text(str(arg)))
    return build_frame(request_id, ERROR_OP, parts)


def decode_error(payload: memoryview) -> Exception:
    """The exception an ERROR payload describes, of the class the broker raised."""
    try:
        r = PayloadReader(payload)
        (code,), message, (count,) = r.take(U8), r.text(), r.take(U8)
        args: list[object] = []
        for _ in range(count):
            (tag,) = r.take(U8)
            args.append(
                None if tag == _ARG_NONE else r.take(I64)[0] if tag == _ARG_INT else r.text()
            )
        r.done()
    except (struct.error, ValueError) as error:
        return ProtocolError(f"malformed error frame: {error}")
    try:
        return _CLASSES[code](*args)
    except (KeyError, TypeError):  # a newer broker's code: keep its message
        return StoreError(message)
