"""RocketMQ's remoting protocol, sans-IO: frames in, commands out, and back.

A frame is ``u32 length`` (of what follows), ``u32`` with the header's serialization type in
its high byte and the header's length in the other three, the header, then the body. The
header is JSON here (type 0, which every RocketMQ server reads and answers in):
``code``, ``opaque`` (matches a response to its request), ``flag`` (bit 0: a response,
bit 1: one-way), ``remark``, ``extFields`` (the request's or response's named fields, all
strings). RocketMQ writes its JSON with fastjson, which leaves integer map keys unquoted
(``{0:"host:port"}``); ``loads`` reads that too.
"""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

FRAME_HEAD = struct.Struct(">II")  # length after this word, serialize type << 24 | header len
RESPONSE_FLAG = 1
ONEWAY_FLAG = 2
JSON_TYPE = 0
LANGUAGE = "PYTHON"
VERSION = 479  # V5_3_3 (MQVersion.Version ordinal): servers gate a few fields on it
MAX_FRAME_BYTES = 256 << 20  # above anything the gateway sends or a pull can answer


class ProtocolError(Exception):
    """The peer sent something that is not a remoting frame."""


@dataclass(slots=True)
class Command:
    code: int
    opaque: int = 0
    flag: int = 0
    remark: str | None = None
    fields: dict[str, str] = field(default_factory=dict)
    body: bytes | memoryview = b""

    @property
    def is_response(self) -> bool:
        return bool(self.flag & RESPONSE_FLAG)


def _text(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def encode(command: Command) -> bytes:
    """One frame. Field values are sent as RocketMQ sends them: strings (true/false for
    booleans)."""
    header: dict[str, Any] = {
        "code": command.code,
        "language": LANGUAGE,
        "version": VERSION,
        "opaque": command.opaque,
        "flag": command.flag,
        "serializeTypeCurrentRPC": "JSON",
    }
    if command.remark is not None:
        header["remark"] = command.remark
    if command.fields:
        header["extFields"] = {k: _text(v) for k, v in command.fields.items()}
    raw = json.dumps(header, separators=(",", ":")).encode()
    body = command.body
    head = FRAME_HEAD.pack(4 + len(raw) + len(body), (JSON_TYPE << 24) | len(raw))
    return b"".join((head, raw, body))


def request(code: int, fields: Mapping[str, object] | None = None, body: bytes = b"") -> Command:
    return Command(
        code, fields={k: _text(v) for k, v in (fields or {}).items() if v is not None}, body=body
    )


_BARE_KEY = re.compile(r"([{,])(-?\d+):")


def loads(data: bytes | memoryview | str) -> Any:
    """JSON as RocketMQ's servers write it (integer keys may be unquoted)."""
    text = data if isinstance(data, str) else bytes(data).decode("utf-8")
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return json.loads(_BARE_KEY.sub(r'\1"\2":', text))


class FrameReader:
    """Bytes in (any chunking), whole commands out."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[Command]:
        self._buffer += data
        commands: list[Command] = []
        buffer = self._buffer
        start = 0
        while len(buffer) - start >= FRAME_HEAD.size:
            length, marker = FRAME_HEAD.unpack_from(buffer, start)
            if length > MAX_FRAME_BYTES or length < 4:
                raise ProtocolError(f"remoting frame of {length} bytes")
            end = start + 4 + length
            if len(buffer) < end:
                break
            header_len = marker & 0xFFFFFF
            if marker >> 24 != JSON_TYPE:
                raise ProtocolError(f"header serialization {marker >> 24} (expected JSON)")
            header_end = start + FRAME_HEAD.size + header_len
            commands.append(
                _command(
                    bytes(buffer[start + FRAME_HEAD.size : header_end]),
                    bytes(buffer[header_end:end]),
                )
            )
            start = end
        if start:
            del buffer[:start]
        return commands


def _command(header: bytes, body: bytes) -> Command:
    try:
        parsed = loads(header)
    except (ValueError, UnicodeDecodeError) as error:
        raise ProtocolError(f"remoting header is not JSON: {error}") from None
    fields = parsed.get("extFields") or {}
    return Command(
        code=int(parsed.get("code", 0)),
        opaque=int(parsed.get("opaque", 0)),
        flag=int(parsed.get("flag", 0)),
        remark=parsed.get("remark"),
        fields={k: str(v) for k, v in fields.items()},
        body=body,
    )
