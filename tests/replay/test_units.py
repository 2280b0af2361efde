"""Pure pieces of the replay pipeline: schedule math, trace parsing, the provenance stamp."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pika.spec
import pytest

from replay.amqp_props import decode, encode, provenance_of, stamp, without_replay_header
from replay.capture import firehose_row
from replay.pacing import (
    UNBOUNDED,
    Schedule,
    monotone_times,
    parse_speed,
    share_of_rate,
)
from replay.trace_format import LineRange, parse_line, read_range, split_ranges


def trace_line(**overrides: object) -> str:
    document: dict[str, object] = {
        "channel": 1,
        "connection": "c1",
        "exchange": "x",
        "node": "rabbit@h",
        "payload": base64.b64encode(b"\x00\xffbody").decode(),
        "properties": {"headers": {"seq": 1}},
        "queue": "none",
        "routed_queues": ["q"],
        "routing_keys": ["rk"],
        "timestamp": "2026-01-02T03:04:05.678+00:00",
        "type": "published",
        "user": "guest",
        "vhost": "/",
    }
    document.update(overrides)
    return json.dumps(document)


# -- pacing ------------------------------------------------------------------------------------


def test_schedule_is_absolute_and_scaled_by_speed() -> None:
    schedule = Schedule(start_s=1000.0, t0_ms=50_000, speed=4.0)
    assert schedule.due(50_000) == 1000.0
    assert schedule.due(54_000) == 1001.0  # 4 s of capture at speed 4
    assert schedule.due(58_000) == 1002.0  # no drift: not the sum of slept gaps


def test_schedule_never_goes_backwards() -> None:
    schedule = Schedule(start_s=0.0, t0_ms=0, speed=1.0)
    assert schedule.due(2_000) == 2.0
    assert schedule.due(1_000) == 2.0  # a capture clock step back does not reorder


def test_rate_caps_on_the_same_absolute_clock() -> None:
    schedule = Schedule(start_s=10.0, t0_ms=0, speed=UNBOUNDED, rate=4.0)
    assert [schedule.due(0) for _ in range(5)] == [10.0, 10.25, 10.5, 10.75, 11.0]
    paced = Schedule(start_s=10.0, t0_ms=0, speed=1.0, rate=2.0)
    assert [paced.due(t) for t in (0, 100, 5_000)] == [10.0, 10.5, 15.0]


def test_speed_parsing_and_rate_shares() -> None:
    assert parse_speed("4") == 4.0
    assert parse_speed("max") == UNBOUNDED
    with pytest.raises(ValueError):
        parse_speed("0")
    assert share_of_rate(1000, 4) == 250
    assert share_of_rate(None, 4) is None
    assert monotone_times([5, 3, 7, 6]) == [5, 5, 7, 7]


# -- the tracing plugin's log ------------------------------------------------------------------


def test_a_published_line_becomes_a_capture_row() -> None:
    row = parse_line(trace_line().encode())
    assert row is not None
    assert row["body"] == b"\x00\xffbody"
    assert row["ts_ms"] == 1767323045678
    assert (row["exchange"], row["routing_key"], row["routed_queues"]) == ("x", "rk", ["q"])
    assert decode(row["properties_raw"]).headers == {"seq": 1}
    assert parse_line(trace_line(type="received").encode()) is None


def test_bad_lines_are_reported_with_line_numbers_and_a_truncated_tail(tmp_path: Path) -> None:
    trace = tmp_path / "t.log"
    good = trace_line()
    lines = [good, "{not json", trace_line(payload="%%%"), good, json.dumps([1]), good]
    trace.write_text("\n".join(lines) + "\n" + good[:40])  # the plugin is mid-write
    (part,) = split_ranges([trace])
    rows = list(read_range(part))
    errors = {r["line"]: r["error"] for r in rows if r["error"]}
    assert sorted(errors) == [2, 3, 5, 7]
    assert errors[2].startswith("not JSON")
    assert "unreadable field" in errors[3]
    assert errors[7].startswith("truncated last line")
    assert [r["line"] for r in rows if not r["error"]] == [1, 4, 6]
    assert [r["capture_id"] for r in rows][:2] == ["t.log:1", "t.log:2"]


def test_ranges_split_at_line_boundaries_and_keep_line_numbers(tmp_path: Path) -> None:
    trace = tmp_path / "t.log"
    trace.write_text("".join(trace_line(channel=i) + "\n" for i in range(1, 41)))
    ranges = split_ranges([trace], range_bytes=1000)
    assert len(ranges) > 3
    assert ranges[0].start == 0 and ranges[-1].end == trace.stat().st_size
    rows = [row for part in ranges for row in read_range(part)]
    assert [r["line"] for r in rows] == list(range(1, 41))
    assert [r["channel"] for r in rows] == list(range(1, 41))
    assert all(r["error"] is None for r in rows)
    empty = tmp_path / "empty.log"
    empty.write_bytes(b"")
    assert split_ranges([empty]) == []
    assert list(read_range(LineRange(str(empty), 0, 0, 0, 1))) == []


# -- properties and the provenance header ------------------------------------------------------


@pytest.mark.parametrize(
    "properties",
    [
        pika.spec.BasicProperties(),
        pika.spec.BasicProperties(content_type="application/octet-stream", priority=3),
        pika.spec.BasicProperties(
            content_type="t",
            content_encoding="e",
            headers={"a": 1, "b": [b"x", -2]},
            delivery_mode=2,
            message_id="m",
            timestamp=17,
            reply_to="r",
        ),
    ],
)
def test_stamp_adds_the_header_and_changes_nothing_else(
    properties: pika.spec.BasicProperties,
) -> None:
    raw = encode(properties)
    provenance = {
        "capture": "c",
        "id": "t.log:7",
        "ts": 1767323045678,
        "connection": "x",
        "channel": 3,
        "seq": 9,
    }
    stamped = stamp(raw, provenance)
    assert provenance_of(stamped) == provenance
    assert without_replay_header(stamped) == without_replay_header(raw)
    assert decode(stamped).headers == {**(properties.headers or {}), "x-mqgw-replay": provenance}


def test_firehose_headers_become_a_capture_row() -> None:
    headers = {
        "exchange_name": "x",
        "routing_keys": ["rk", "cc"],
        "properties": {"headers": {"s": 2}, "delivery_mode": 2},
        "vhost": "/",
        "connection": "c",
        "channel": 1,
        "routed_queues": ["q"],
        "node": "n",
    }
    row = firehose_row(5, 1000, headers, b"\x01")
    assert row["error"] is None
    assert (row["routing_key"], row["routing_keys"], row["channel"]) == ("rk", ["rk", "cc"], 1)
    assert decode(row["properties_raw"]).delivery_mode == 2
    assert firehose_row(6, 1000, {"vhost": "/"}, b"")["error"].startswith("unusable")
    floats = {**headers, "properties": {"headers": {"f": 2.5}}}
    assert "cannot encode" in firehose_row(7, 1000, floats, b"")["error"]
