"""The replication calls of the broker protocol (op REPLICATE), sans-IO.

Replication is one call per round, not per message, so its head is a small JSON object and
its data the raw commitlog bytes of a chunk (storage/replication/replica_log.py):

- request ``Replicate(kind, head)``: ``kind`` is ``epochs`` (the master's epoch file and end)
  or ``fetch`` (the slave's id, epoch, the offset it has durably — its acknowledgement — and
  what it knows of the queue registry and offsets);
- answer ``Replicated(head, data)``: the master's answer and, for a fetch, a chunk.

Payload: ``u16 kind | u32 head length | head JSON`` (+ ``data`` in an answer).
"""

from __future__ import annotations

import json
from typing import Any, NamedTuple

from storage.wire.frames import FRAME_LEN, PayloadReader, ProtocolError, pack_text


class Replicate(NamedTuple):
    kind: str  # "epochs" | "fetch"
    head: dict[str, Any]


class Replicated(NamedTuple):
    head: dict[str, Any]
    data: bytes


def _json(head: dict[str, Any]) -> bytes:
    return json.dumps(head, separators=(",", ":")).encode()


def _take_json(r: PayloadReader) -> dict[str, Any]:
    (size,) = r.take(FRAME_LEN)
    end = r.pos + size
    if end > len(r.buf):
        raise ProtocolError("replication head runs past the end of the frame")
    try:
        value = json.loads(bytes(r.buf[r.pos : end]))
    except ValueError as error:
        raise ProtocolError(f"replication head is not JSON: {error}") from None
    if not isinstance(value, dict):
        raise ProtocolError("replication head is not an object")
    r.pos = end
    return value


def put_replicate(parts: list[Any], request: Replicate) -> None:
    head = _json(request.head)
    parts += (pack_text(request.kind), FRAME_LEN.pack(len(head)), head)


def get_replicate(r: PayloadReader) -> Replicate:
    kind = r.text()
    return Replicate(kind, _take_json(r))


def put_replicated(parts: list[Any], answer: Replicated) -> None:
    head = _json(answer.head)
    parts += (FRAME_LEN.pack(len(head)), head, answer.data)


def get_replicated(r: PayloadReader) -> Replicated:
    head = _take_json(r)
    data = bytes(r.buf[r.pos :])
    r.pos = len(r.buf)
    return Replicated(head, data)
