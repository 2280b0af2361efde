"""Messages between mqgw's records and RocketMQ's formats.

A record becomes one RocketMQ message per destination partition. The AMQP body is the
message body, so other RocketMQ consumers read it as it was published; the rest rides in
message properties (RocketMQ's ``name\\x01value\\x02`` string, UTF-8):

- ``MQGW_X`` / ``MQGW_K``: the exchange and routing key (UTF-8 text when they are, else
  ``MQGW_XB`` / ``MQGW_KB`` in base64); ``TAGS`` is not set (filtering is the gateway's);
- ``MQGW_P``: the raw AMQP content properties, base64 (absent when empty);
- ``MQGW_F``: the record's flags (absent when 0); ``MQGW_T``: its born time when it is not
  the batch's (a batch send has one born time, the header's).

RocketMQ holds at most 32767 bytes of properties per message; AMQP properties too large for
that (a header table of ~24 KiB) go in front of the body instead, with ``MQGW_E`` set: the
body is then ``u32 length, properties, AMQP body`` (RocketMQ consumers see the envelope).
"""

from __future__ import annotations

import base64
import struct
from collections.abc import Iterable

from storage.record import Record, StoredMessage

NAME_VALUE = "\x01"
SEPARATOR = "\x02"
PROPERTIES_ROOM = 24 << 10  # AMQP properties above this go in the envelope
MAGIC_V1 = -626843481 & 0xFFFFFFFF
MAGIC_V2 = -626843477 & 0xFFFFFFFF
BORNHOST_V6 = 1 << 4
STOREHOST_V6 = 1 << 5

BATCH_ITEM = struct.Struct(">iiiii")  # total size, magic, body crc, flag, body length
ENVELOPE = struct.Struct(">I")
_HEAD = struct.Struct(">iiiiiqqiq")  # size, magic, crc, queue id, flag, q off, phys, sysflag, born
_TAIL = struct.Struct(">iq")  # reconsume times, prepared transaction offset


def encode_properties(properties: dict[str, str]) -> str:
    return "".join(f"{k}{NAME_VALUE}{v}{SEPARATOR}" for k, v in properties.items())


def decode_properties(text: str) -> dict[str, str]:
    found: dict[str, str] = {}
    for item in text.split(SEPARATOR):
        name, sep, value = item.partition(NAME_VALUE)
        if sep:
            found[name] = value
    return found


def _text_or_b64(value: bytes, name: str, into: dict[str, str]) -> None:
    if not value:
        return
    try:
        text = value.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is None or NAME_VALUE in text or SEPARATOR in text:
        into[name + "B"] = base64.b64encode(value).decode()
    else:
        into[name] = text


def message_of(record: Record, born_ts_ms: int) -> tuple[bytes, bytes]:
    """(properties string as UTF-8, body) of the RocketMQ message for ``record``."""
    props: dict[str, str] = {}
    _text_or_b64(record.exchange, "MQGW_X", props)
    _text_or_b64(record.routing_key, "MQGW_K", props)
    body: bytes | bytearray = record.body
    if len(record.properties) > PROPERTIES_ROOM:
        props["MQGW_E"] = "1"
        body = b"".join((ENVELOPE.pack(len(record.properties)), record.properties, body))
    elif record.properties:
        props["MQGW_P"] = base64.b64encode(record.properties).decode()
    if record.flags:
        props["MQGW_F"] = str(record.flags)
    if record.born_ts_ms != born_ts_ms:
        props["MQGW_T"] = str(record.born_ts_ms)
    return encode_properties(props).encode("utf-8"), bytes(body)


def batch_body(messages: Iterable[tuple[bytes, bytes]]) -> bytes:
    """The body of a batch send (RocketMQ's client encoding, which the broker re-encodes:
    magic and CRC are its own)."""
    parts: list[bytes] = []
    for props, body in messages:
        size = BATCH_ITEM.size + len(body) + 2 + len(props)
        parts += (BATCH_ITEM.pack(size, 0, 0, 0, len(body)), body,
                  struct.pack(">h", len(props)), props)  # fmt: skip
    return b"".join(parts)


def properties_size(record: Record) -> int:
    """What a record costs in a RocketMQ message (its check against the maximum)."""
    amqp = len(record.properties)
    in_props = 0 if amqp > PROPERTIES_ROOM else (amqp + 2) // 3 * 4
    return (
        len(record.body)
        + (amqp + 4 if amqp > PROPERTIES_ROOM else 0)
        + in_props
        + 2 * (len(record.exchange) + len(record.routing_key))
        + 64
    )


def _bytes_of(props: dict[str, str], name: str) -> bytes:
    text = props.get(name)
    if text is not None:
        return text.encode("utf-8")
    encoded = props.get(name + "B")
    return base64.b64decode(encoded) if encoded else b""


def decode_pulled(data: bytes | memoryview) -> list[StoredMessage]:
    """The messages of a pull response's body (RocketMQ's stored format), as the gateway
    reads them: ``properties`` and ``body`` are views of ``data`` where they can be."""
    view = memoryview(data)
    messages: list[StoredMessage] = []
    at = 0
    end = len(view)
    while at + _HEAD.size <= end:
        size, magic, _crc, _qid, _flag, queue_offset, physical, sysflag, born = _HEAD.unpack_from(
            view, at
        )
        if size <= 0 or at + size > end:
            break
        pos = at + _HEAD.size + (20 if sysflag & BORNHOST_V6 else 8)
        (store_ts,) = struct.unpack_from(">q", view, pos)
        pos += 8 + (20 if sysflag & STOREHOST_V6 else 8) + _TAIL.size
        (body_len,) = struct.unpack_from(">i", view, pos)
        body = view[pos + 4 : pos + 4 + body_len]
        pos += 4 + body_len
        if magic & 0xFFFFFFFF == MAGIC_V2:
            (topic_len,) = struct.unpack_from(">h", view, pos)
            pos += 2 + topic_len
        else:
            topic_len = view[pos]
            pos += 1 + topic_len
        (props_len,) = struct.unpack_from(">h", view, pos)
        props = decode_properties(bytes(view[pos + 2 : pos + 2 + props_len]).decode("utf-8"))
        messages.append(_stored(queue_offset, physical, born, store_ts, body, props))
        at += size
    return messages


def _stored(
    queue_offset: int,
    physical: int,
    born: int,
    store_ts: int,
    body: memoryview,
    props: dict[str, str],
) -> StoredMessage:
    if props.get("MQGW_E"):
        (amqp_len,) = ENVELOPE.unpack_from(body, 0)
        amqp = body[4 : 4 + amqp_len]
        body = body[4 + amqp_len :]
    else:
        encoded = props.get("MQGW_P")
        amqp = memoryview(base64.b64decode(encoded) if encoded else b"")
    return StoredMessage(
        queue_offset,
        physical,
        _bytes_of(props, "MQGW_X"),
        _bytes_of(props, "MQGW_K"),
        amqp,
        body,
        int(props.get("MQGW_T", born)),
        store_ts,
        int(props.get("MQGW_F", 0)),
    )
