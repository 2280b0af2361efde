from __future__ import annotations

from storage import Record


def rec(body: bytes, *dests: tuple[int, int], key: bytes = b"rk") -> Record:
    return Record(b"ex", key, b"\x90\x00\x02", body, tuple(dests), born_ts_ms=7, flags=1)


def bodies(messages: list) -> list[bytes]:  # type: ignore[type-arg]
    return [bytes(m.body) for m in messages]
