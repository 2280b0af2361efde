"""Logging for `mqgw serve` (and the other commands): stderr and/or a file with rotation,
plain text or JSON lines, a level per category.

Categories are RabbitMQ's idea (``log.connection.level = debug``) mapped onto the loggers
the code uses. A JSON line carries ``time``, ``level``, ``logger``, ``category``,
``message``, plus ``connection`` when the call passed ``extra={"connection": name}`` and
``exception`` when there is a traceback.
"""

from __future__ import annotations

import json
import logging
import logging.handlers
import re
import sys
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from gateway.config.settings import GatewaySettings

LogFormat = Literal["plain", "json"]
PLAIN_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

# Category -> the loggers it covers (a logger's children follow it unless set themselves).
CATEGORIES: dict[str, tuple[str, ...]] = {
    "connection": ("mqgw.connection", "mqgw.tls"),
    "channel": ("mqgw.channel",),
    "queue": ("mqgw.queue", "mqgw.vhost", "mqgw.redelivery", "mqgw.delayed"),
    "storage": ("mqgw.storage",),
    "scheduler": ("mqgw.push", "mqgw.timer"),
    "admin": (
        "mqgw.admin", "mqgw.definitions", "mqgw.controls",
        "uvicorn", "uvicorn.error", "uvicorn.access",
    ),
    "node": ("mqgw.node", "mqgw.server"),
}  # fmt: skip
# Levels below RabbitMQ's names; "none" silences a category.
LEVELS: dict[str, int] = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "critical": logging.CRITICAL,
    "none": logging.CRITICAL + 10,
}
# The admin HTTP server's own request lines stay quiet unless the admin category is set.
QUIET_BY_DEFAULT = {"uvicorn.error": logging.WARNING, "uvicorn.access": logging.WARNING}

_WHEN = re.compile(r"^(\d*)\s*(s|m|h|d|midnight|w[0-6])$")
_SIZE = re.compile(r"^(\d+)\s*(b|k|kb|kib|m|mb|mib|g|gb|gib)?$")
_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


def level_number(name: str) -> int:
    """A level name (case-insensitive, "warn" = "warning"); ValueError names the choices."""
    key = name.strip().lower()
    key = "warning" if key == "warn" else key
    if key not in LEVELS:
        raise ValueError(f"unknown log level {name!r}: use {', '.join(LEVELS)}")
    return LEVELS[key]


def check_category(name: str) -> str:
    """A category of CATEGORIES, or a logger name with a dot ("mqgw.vhost", "asyncio.x")."""
    if name in CATEGORIES or "." in name:
        return name
    raise ValueError(f"unknown log category {name!r}: use {', '.join(CATEGORIES)} or a logger name")


def category_of(logger_name: str) -> str:
    """The category a logger's lines belong to ("default" for the rest)."""
    best, best_len = "default", -1
    for category, names in CATEGORIES.items():
        for name in names:
            if (logger_name == name or logger_name.startswith(name + ".")) and len(name) > best_len:
                best, best_len = category, len(name)
    return best


def parse_rotation(value: int | str) -> int | tuple[str, int]:
    """``log_file_rotation``: a size (bytes, or with a unit: "10MiB", "512k") rotates by
    size; a time ("midnight", "h", "12h", "d", "w0".."w6") rotates by time, as
    TimedRotatingFileHandler's ``when`` and ``interval``. Returns bytes or (when, interval)."""
    if isinstance(value, int):
        if value <= 0:
            raise ValueError("a rotation size must be a positive number of bytes")
        return value
    text = value.strip().lower()
    if size := _SIZE.match(text):
        number = int(size.group(1)) * _UNITS[(size.group(2) or "")[:1]]
        return parse_rotation(number)
    if when := _WHEN.match(text):
        interval = int(when.group(1) or 1)
        if interval <= 0:
            raise ValueError("a rotation interval must be positive")
        return when.group(2).upper() if when.group(2) != "midnight" else "midnight", interval
    raise ValueError(
        f"bad rotation {value!r}: a size in bytes (1048576, 10MiB) or a time "
        "(midnight, h, 12h, d, w0..w6)"
    )


class JsonFormatter(logging.Formatter):
    """One JSON object per line."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "category": category_of(record.name),
            "message": record.getMessage(),
        }
        connection = getattr(record, "connection", None)
        if connection is not None:
            entry["connection"] = str(connection)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return json.dumps(entry, ensure_ascii=False, default=str)


def _file_handler(path: Path, rotation: int | str | None, backups: int) -> logging.FileHandler:
    if rotation is None:  # an outside logrotate may move the file: reopen it then
        return logging.handlers.WatchedFileHandler(path, encoding="utf-8")
    spec = parse_rotation(rotation)
    if isinstance(spec, int):
        return logging.handlers.RotatingFileHandler(
            path, maxBytes=spec, backupCount=backups, encoding="utf-8"
        )
    when, interval = spec
    return logging.handlers.TimedRotatingFileHandler(
        path, when=when, interval=interval, backupCount=backups, encoding="utf-8", utc=True
    )


_configured: set[str] = set()  # loggers whose level we set: reset on the next call


def configure_logging(
    level: str = "info",
    *,
    file: Path | None = None,
    rotation: int | str | None = None,
    rotation_count: int = 5,
    fmt: LogFormat = "plain",
    levels: Mapping[str, str] | None = None,
    console: bool = True,
) -> None:
    """Replace the root logger's handlers. OSError (with the file's name) if the log file
    cannot be opened; ValueError for a bad level, category or rotation."""
    handlers: list[logging.Handler] = []
    if file is not None:
        try:
            handlers.append(_file_handler(file, rotation, rotation_count))
        except OSError as error:
            raise OSError(f"log_file {file}: cannot open: {error.strerror or error}") from None
    if console:
        handlers.append(logging.StreamHandler(sys.stderr))
    formatter = JsonFormatter() if fmt == "json" else logging.Formatter(PLAIN_FORMAT)
    for handler in handlers:
        handler.setFormatter(formatter)
    root = logging.getLogger()
    for old in root.handlers[:]:
        root.removeHandler(old)
        old.close()
    for handler in handlers:
        root.addHandler(handler)
    if not handlers:
        root.addHandler(logging.NullHandler())
    root.setLevel(level_number(level))
    for name in _configured:
        logging.getLogger(name).setLevel(logging.NOTSET)
    _configured.clear()
    wanted: dict[str, int] = dict(QUIET_BY_DEFAULT)
    for category, category_level in (levels or {}).items():
        number = level_number(category_level)
        for name in CATEGORIES.get(check_category(category), (category,)):
            wanted[name] = number
    for name, number in wanted.items():
        logging.getLogger(name).setLevel(number)
        _configured.add(name)


def configure_from_settings(settings: GatewaySettings) -> None:
    """configure_logging with the log_* settings."""
    configure_logging(
        settings.log_level,
        file=settings.log_file,
        rotation=settings.log_file_rotation,
        rotation_count=settings.log_file_rotation_count,
        fmt=settings.log_format,
        levels=settings.log_levels,
        console=settings.log_console,
    )
