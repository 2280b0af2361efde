"""The JSON shape of every metadata model, shared by the stores and the change feed.

A model is ``model_dump(mode="python")`` with its AMQP ``arguments`` passed through
``amqp_values.to_json`` (binary, decimal and timestamp values are tagged so they come back
with their type). The local store's metadata.json, the Redis store's values and the change
feed's documents all use this one shape, so a document written by one reads in the other.
"""

from __future__ import annotations

import json
from typing import Any, TypeVar

from pydantic import BaseModel

from meta.amqp_values import from_json, to_json

M = TypeVar("M", bound=BaseModel)


def dump(model: BaseModel) -> dict[str, Any]:
    data = model.model_dump(mode="python")
    if "arguments" in data:
        data["arguments"] = to_json(data["arguments"])
    return data


def load(model_type: type[M], data: dict[str, Any]) -> M:
    if "arguments" in data:
        data = {**data, "arguments": from_json(data["arguments"])}
    return model_type.model_validate(data)


def dumps(model: BaseModel) -> str:
    """One compact JSON text (a Redis value, a stream field)."""
    return json.dumps(dump(model), separators=(",", ":"), sort_keys=True)


def loads(model_type: type[M], text: str | bytes) -> M:
    return load(model_type, json.loads(text))


def key_of(*parts: str) -> str:
    """An unambiguous hash field for a composite key, e.g. (user, vhost): a JSON array."""
    return json.dumps(list(parts), separators=(",", ":"))


def parse_key(text: str | bytes) -> list[str]:
    """The parts of a ``key_of`` field."""
    return [str(part) for part in json.loads(text)]
