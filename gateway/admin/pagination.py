"""RabbitMQ's list query parameters, as the management plugin (rabbit_mgmt_util) reads them.

- ``name`` filters on the name (case-insensitive substring; a regular expression with
  ``use_regex=true``);
- ``sort`` (a dotted column, ``message_stats.publish``) and ``sort_reverse=true``; without
  ``sort`` the list is in the endpoint's default order (vhost, then name, for most);
- ``columns=name,messages,message_stats.publish_details.rate`` keeps only those fields;
- ``page`` (from 1) and ``page_size`` (1..500, default 100) answer with the plugin's page
  object: ``filtered_count``, ``item_count``, ``items``, ``page``, ``page_count``,
  ``page_size``, ``total_count``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from fastapi import HTTPException, Request

MAX_PAGE_SIZE = 500
DEFAULT_PAGE_SIZE = 100


def _lookup(row: Mapping[str, Any], dotted: str) -> Any:
    value: Any = row
    for part in dotted.split("."):
        if not isinstance(value, Mapping):
            return None
        value = value.get(part)
    return value


def _sort_key(value: Any) -> tuple[int, Any]:
    """Values of mixed types sort without error: missing first, numbers, then text."""
    if value is None:
        return (0, 0)
    if isinstance(value, bool | int | float):
        return (1, value)
    return (2, str(value))


def _has(row: Mapping[str, Any], dotted: str) -> bool:
    value: Any = row
    for part in dotted.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return False
        value = value[part]
    return True


def select_columns(row: Mapping[str, Any], columns: Sequence[str]) -> dict[str, Any]:
    """Only ``columns`` of ``row``; a dotted column keeps its nesting."""
    result: dict[str, Any] = {}
    for column in columns:
        if not _has(row, column):
            continue
        parts = column.split(".")
        value = _lookup(row, column)
        target = result
        for part in parts[:-1]:
            target = target.setdefault(part, {})
        target[parts[-1]] = value
    return result


def _int_param(request: Request, name: str, default: int) -> int:
    text = request.query_params.get(name)
    if text is None or text == "":
        return default
    try:
        return int(text)
    except ValueError:
        raise HTTPException(400, f"{name} must be an integer, got '{text}'") from None


def _truthy(request: Request, name: str) -> bool:
    return request.query_params.get(name, "false").lower() == "true"


def _name_filter(request: Request) -> re.Pattern[str] | None:
    name = request.query_params.get("name")
    if not name:
        return None
    pattern = name if _truthy(request, "use_regex") else re.escape(name)
    try:
        return re.compile(pattern, re.IGNORECASE)
    except re.error as error:
        raise HTTPException(400, f"invalid regular expression '{name}': {error}") from None


def apply(
    request: Request,
    rows: list[dict[str, Any]],
    default_sort: Sequence[str] = ("vhost", "name"),
) -> list[dict[str, Any]] | dict[str, Any]:
    """Filter, sort, page and trim ``rows`` as the query asks (the plugin's order of steps)."""
    total = len(rows)
    pattern = _name_filter(request)
    if pattern is not None:
        rows = [r for r in rows if pattern.search(str(r.get("name", "")))]
    sort = request.query_params.get("sort")
    keys = [sort] if sort else list(default_sort)
    rows = sorted(
        rows,
        key=lambda r: tuple(_sort_key(_lookup(r, k)) for k in keys),
        reverse=_truthy(request, "sort_reverse"),
    )
    columns_text = request.query_params.get("columns")
    columns = [c for c in columns_text.split(",") if c] if columns_text else []
    if "page" not in request.query_params:
        return [select_columns(r, columns) for r in rows] if columns else rows
    page = _int_param(request, "page", 1)
    size = _int_param(request, "page_size", DEFAULT_PAGE_SIZE)
    if not 1 <= size <= MAX_PAGE_SIZE:
        raise HTTPException(400, f"page_size must be between 1 and {MAX_PAGE_SIZE}")
    page_count = max(1, math.ceil(len(rows) / size))
    if not 1 <= page <= page_count:
        raise HTTPException(400, f"page out of range: {page} (of {page_count})")
    items = rows[(page - 1) * size : page * size]
    if columns:
        items = [select_columns(r, columns) for r in items]
    return {
        "filtered_count": len(rows),
        "item_count": len(items),
        "items": items,
        "page": page,
        "page_count": page_count,
        "page_size": size,
        "total_count": total,
    }


def one(request: Request, row: dict[str, Any]) -> dict[str, Any]:
    """A single object trimmed to ``columns=`` when asked."""
    columns_text = request.query_params.get("columns")
    if not columns_text:
        return row
    return select_columns(row, [c for c in columns_text.split(",") if c])
