"""The log_* settings: JSON lines, rotation by size, a level per category."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.config.logging_setup import (
    category_of,
    configure_from_settings,
    configure_logging,
    parse_rotation,
)
from gateway.config.sources import resolve


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    configure_logging("info", console=False)  # closes our file handlers, resets categories
    for handler in root.handlers[:]:
        root.removeHandler(handler)
    for handler in handlers:
        root.addHandler(handler)
    root.setLevel(level)


def _lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_json_lines_rotate_by_size(tmp_path: Path) -> None:
    log_file = tmp_path / "mqgw.log"
    settings = resolve(
        {
            "log_file": log_file,
            "log_format": "json",
            "log_file_rotation": "2k",
            "log_file_rotation_count": 3,
            "log_console": False,
        },
        {},
    ).settings
    configure_from_settings(settings)
    connection = logging.getLogger("mqgw.connection")
    for n in range(100):
        connection.info("accepting AMQP connection %d", n, extra={"connection": f"peer{n}"})
    logging.getLogger("mqgw.storage").warning("retention deleted %d segment(s)", 1)
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        logging.getLogger("mqgw.node").exception("it failed")
    files = sorted(tmp_path.iterdir())
    assert [f.name for f in files] == ["mqgw.log", "mqgw.log.1", "mqgw.log.2", "mqgw.log.3"]
    for path in files:
        assert path.stat().st_size <= 2048
        for entry in _lines(path):
            assert {"time", "level", "logger", "category", "message"} <= entry.keys()
    newest = _lines(log_file)
    assert newest[-2]["category"] == "storage" and newest[-2]["level"] == "warning"
    assert newest[-1]["exception"] and "RuntimeError: boom" in str(newest[-1]["exception"])
    accepted = [e for e in newest if e["logger"] == "mqgw.connection"]
    assert accepted and all(
        e["connection"] == f"peer{str(e['message']).split()[-1]}" and e["category"] == "connection"
        for e in accepted
    )


def test_a_level_per_category(tmp_path: Path) -> None:
    log_file = tmp_path / "mqgw.log"
    configure_logging(
        "info",
        file=log_file,
        fmt="json",
        levels={"storage": "warning", "scheduler": "debug", "mqgw.vhost": "error"},
        console=False,
    )
    logging.getLogger("mqgw.storage").info("recovery: storage info")
    logging.getLogger("mqgw.storage").warning("storage warning")
    logging.getLogger("mqgw.connection").info("connection info")
    logging.getLogger("mqgw.connection").debug("connection debug")
    logging.getLogger("mqgw.push").debug("scheduler debug")
    logging.getLogger("mqgw.vhost").warning("vhost warning")
    messages = [e["message"] for e in _lines(log_file)]
    assert messages == ["storage warning", "connection info", "scheduler debug"]


def test_plain_format_and_reconfiguring_resets_category_levels(tmp_path: Path) -> None:
    log_file = tmp_path / "plain.log"
    configure_logging("info", file=log_file, levels={"storage": "none"}, console=False)
    logging.getLogger("mqgw.storage").error("hidden")
    configure_logging("info", file=log_file, console=False)
    logging.getLogger("mqgw.storage").info("shown")
    (line,) = log_file.read_text().splitlines()
    assert line.endswith(" INFO mqgw.storage: shown")


def test_categories_rotation_specs_and_unopenable_files(tmp_path: Path) -> None:
    assert category_of("mqgw.connection") == "connection"
    assert category_of("uvicorn.access") == "admin"
    assert category_of("mqgw.push") == "scheduler"
    assert category_of("asyncio") == "default"
    assert parse_rotation("10MiB") == 10 << 20
    assert parse_rotation(4096) == 4096
    assert parse_rotation("midnight") == ("midnight", 1)
    assert parse_rotation("12h") == ("H", 12)
    assert parse_rotation("W6") == ("W6", 1)
    with pytest.raises(OSError, match=r"log_file .*missing/x\.log: cannot open"):
        configure_logging(file=tmp_path / "missing" / "x.log")
