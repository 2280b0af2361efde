"""Reading the settings' sources with one set of key names, and naming where each value
came from: flags > MQGW_* environment > the TOML config file > defaults.

Every problem is a ConfigError with a one-line message naming the key, the file or the
variable: a missing or unreadable file, an unknown key in the file, a value that does not
parse or validate. Unknown MQGW_* variables are reported (``Resolved.unknown_env``) for the
caller to warn about: other tools use the prefix too.
"""

from __future__ import annotations

import difflib
import json
import os
import tomllib
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo
from pydantic_settings import PydanticBaseSettingsSource

from gateway.config.settings import READ_ENVIRONMENT, GatewaySettings

ENV_PREFIX = "MQGW_"
HOST = "host"  # not a field: sets amqp_host and admin_host unless the same source sets them
HOST_KEYS = ("amqp_host", "admin_host")
ValueKind = Literal["bool", "list", "dict", "models", "scalar"]


class ConfigError(Exception):
    """A configuration problem, in one line that names the key and its source."""


@dataclass(frozen=True)
class Source:
    kind: Literal["default", "file", "env", "flag"]
    name: str = ""

    def __str__(self) -> str:
        return self.kind if self.kind == "default" else f"{self.kind} {self.name}"


DEFAULT = Source("default")


def setting_fields() -> dict[str, FieldInfo]:
    return dict(GatewaySettings.model_fields)


def flag_name(key: str) -> str:
    return "--config" if key == "config_file" else "--" + key.replace("_", "-")


def env_name(key: str) -> str:
    return ENV_PREFIX + key.upper()


def _union_args(annotation: Any) -> tuple[Any, ...]:
    if get_origin(annotation) in (Union, types.UnionType):
        return get_args(annotation)
    return (annotation,)


def is_optional(key: str) -> bool:
    if key == HOST:
        return False
    return type(None) in _union_args(setting_fields()[key].annotation)


def value_kind(key: str) -> ValueKind:
    """How a text value (flag, environment) of ``key`` is read."""
    if key == HOST:
        return "scalar"
    types_ = [t for t in _union_args(setting_fields()[key].annotation) if t is not type(None)]
    if len(types_) != 1:
        return "scalar"
    origin, args = get_origin(types_[0]), get_args(types_[0])
    if types_[0] is bool:
        return "bool"
    if origin is list:
        model = args and isinstance(args[0], type) and issubclass(args[0], BaseModel)
        return "models" if model else "list"
    if origin is dict:
        return "dict"
    return "scalar"


def parse_text(key: str, text: str) -> Any:
    """A flag's or variable's text as the value of ``key``; ValueError if it cannot be.
    Lists: JSON or comma-separated; tables: JSON or ``k=v,k=v``; users, policies: JSON;
    "none" unsets an optional setting; scalars are left to the model to validate."""
    stripped = text.strip()
    if is_optional(key) and stripped.lower() in ("none", "null", ""):
        return None
    kind = value_kind(key)
    try:
        if kind == "list":
            if stripped.startswith("["):
                return json.loads(stripped)
            return [item.strip() for item in stripped.split(",") if item.strip()]
        if kind == "dict":
            if stripped.startswith("{"):
                return json.loads(stripped)
            pairs = [item.strip() for item in stripped.split(",") if item.strip()]
            if any("=" not in pair for pair in pairs):
                raise ValueError(f"expected k=v[,k=v] or a JSON object, got {text!r}")
            return {k.strip(): v.strip() for k, v in (pair.split("=", 1) for pair in pairs)}
        if kind == "models":
            value = json.loads(stripped)
            return [value] if isinstance(value, dict) else value
    except json.JSONDecodeError as error:
        raise ValueError(f"not valid JSON: {error}") from None
    return text


def combine(key: str, parts: list[Any]) -> Any:
    """Repeated flags (--vhosts a --vhosts b): lists concatenate, tables merge."""
    if len(parts) == 1 or value_kind(key) not in ("list", "dict", "models"):
        return parts[-1]
    if any(part is None for part in parts):
        raise ValueError("'none' cannot be combined with other values")
    if value_kind(key) == "dict":
        return {k: v for part in parts for k, v in part.items()}
    return [item for part in parts for item in part]


Layer = tuple[dict[str, Any], dict[str, Source]]


def did_you_mean(key: str, choices: list[str], spell: Callable[[str], str] = repr) -> str:
    """The choice closest to a mistyped ``key`` as " (did you mean 'amqp_port'?)", or ""."""
    close = [c for c in difflib.get_close_matches(key, choices, n=1) if c != key]
    return f" (did you mean {spell(close[0])}?)" if close else ""


def _unknown(key: str, where: str) -> ConfigError:
    hint = did_you_mean(key.replace("-", "_"), [*setting_fields(), HOST])
    return ConfigError(f"{where}: unknown key '{key}'{hint}")


def env_hint(var: str) -> str:
    """For an MQGW_* variable that names no setting (``Resolved.unknown_env``): the variable
    it was probably meant to be, as " (did you mean MQGW_AMQP_PORT?)", or ""."""
    key = var[len(ENV_PREFIX) :].lower().partition("__")[0]
    return did_you_mean(key, [*setting_fields(), HOST], env_name)


def read_file(path: Path) -> Layer:
    """The TOML file's settings; hyphenated keys are accepted (``amqp-port``)."""
    where = f"config file {path}"
    try:
        data = tomllib.loads(path.read_bytes().decode("utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{where}: not found") from None
    except OSError as error:
        raise ConfigError(f"{where}: cannot read: {error.strerror or error}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{where}: not UTF-8 text") from None
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"{where}: invalid TOML: {error}") from None
    values: dict[str, Any] = {}
    spelled: dict[str, str] = {}
    for raw_key, value in data.items():
        key = raw_key.replace("-", "_")
        if key == "config_file":
            raise ConfigError(f"{where}: '{raw_key}' cannot be set in a config file")
        if key != HOST and key not in setting_fields():
            raise _unknown(raw_key, where)
        if key in values:
            raise ConfigError(f"{where}: '{raw_key}' and '{spelled[key]}' are the same key")
        values[key], spelled[key] = value, raw_key
    return values, dict.fromkeys(values, Source("file", str(path)))


def read_env(environ: Mapping[str, str]) -> tuple[dict[str, Any], dict[str, Source], list[str]]:
    """MQGW_* variables: values, their sources, and the names that match no setting.
    ``MQGW_LOG_LEVELS__STORAGE=warning`` sets one entry of a table."""
    values: dict[str, Any] = {}
    sources: dict[str, Source] = {}
    entries: list[tuple[str, str, str, str]] = []
    unknown: list[str] = []
    fields = setting_fields()
    for var in sorted(environ):
        if not var.upper().startswith(ENV_PREFIX):
            continue
        key, _, entry = var[len(ENV_PREFIX) :].lower().partition("__")
        if entry and key in fields and value_kind(key) == "dict":
            entries.append((key, entry, var, environ[var]))
        elif not entry and (key in fields or key == HOST):
            try:
                values[key] = parse_text(key, environ[var])
            except ValueError as error:
                raise ConfigError(f"{key}: {error} (from env {var})") from None
            sources[key] = Source("env", var)
        else:
            unknown.append(var)
    for key, entry, var, text in entries:
        table = values.setdefault(key, {})
        if not isinstance(table, dict):
            raise ConfigError(f"{key}: {var} sets an entry of a value that is not a table")
        table[entry] = text
        sources[key] = Source("env", var)
    return values, sources, unknown


def _expand_host(layer: Layer) -> Layer:
    values, sources = dict(layer[0]), dict(layer[1])
    if HOST in values:
        host, source = values.pop(HOST), sources.pop(HOST)
        for key in HOST_KEYS:
            if key not in values:
                values[key], sources[key] = host, source
    return values, sources


@dataclass
class Resolved:
    settings: GatewaySettings
    sources: dict[str, Source] = field(default_factory=dict)
    unknown_env: list[str] = field(default_factory=list)

    def source(self, key: str) -> Source:
        return self.sources.get(key, DEFAULT)


def entry_keys(key: str) -> list[str]:
    """The keys of one entry of a list of tables (``users``, ``policies``): its model's."""
    for kind in _union_args(setting_fields()[key].annotation):
        entry = get_args(kind)[0] if get_origin(kind) is list else None
        if isinstance(entry, type) and issubclass(entry, BaseModel):
            return list(entry.model_fields)
    return []


def _describe(error: ValidationError, sources: Mapping[str, Source]) -> str:
    parts = []
    for item in error.errors():
        loc = item["loc"]
        key = str(loc[0]) if loc else "?"
        path = ".".join(str(p) for p in loc) or "?"
        source = sources.get(key, DEFAULT)
        if item["type"] == "extra_forbidden" and len(loc) > 1:  # a typo inside [[users]]
            name, entry = str(loc[-1]), ".".join(str(p) for p in loc[:-1])
            hint = did_you_mean(name, entry_keys(key))
            parts.append(f"{entry}: unknown key '{name}'{hint} (from {source})")
            continue
        given = item.get("input")
        shown = "from"
        if key != "users" and not isinstance(given, dict | list) and item["type"] != "missing":
            shown = f"got {given!r} from"
        parts.append(f"{path}: {item['msg']} ({shown} {source})")
    return "; ".join(parts)


def build(values: Mapping[str, Any], sources: Mapping[str, Source]) -> GatewaySettings:
    """The model from merged values; ConfigError naming each bad key and its source."""
    token = READ_ENVIRONMENT.set(False)
    try:
        return GatewaySettings(**values)
    except ValidationError as error:
        raise ConfigError(_describe(error, sources)) from None
    finally:
        READ_ENVIRONMENT.reset(token)


def flag_sources(flags: Mapping[str, Any]) -> dict[str, Source]:
    return {key: Source("flag", flag_name(key)) for key in flags}


def resolve(
    flags: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
    sources: Mapping[str, Source] | None = None,
) -> Resolved:
    """Settings from ``flags`` (values by key, ``host`` included), ``environ`` (default
    os.environ) and the config file that either names (``config_file``)."""
    flags = dict(flags or {})
    env_values, env_sources, unknown = read_env(os.environ if environ is None else environ)
    layers: list[Layer] = []
    path = flags.get("config_file", env_values.get("config_file"))
    if path is not None:
        layers.append(read_file(Path(path)))
    layers.append((env_values, env_sources))
    layers.append((flags, {**flag_sources(flags), **(sources or {})}))
    values: dict[str, Any] = {}
    merged_sources: dict[str, Source] = {}
    for layer in layers:
        layer_values, layer_sources = _expand_host(layer)
        values.update(layer_values)
        merged_sources.update(layer_sources)
    return Resolved(build(values, merged_sources), merged_sources, unknown)


class EnvironmentSource(PydanticBaseSettingsSource):
    """MQGW_* for GatewaySettings() built directly (tests, embedding): read as above."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False  # unused: __call__ reads every variable at once

    def __call__(self) -> dict[str, Any]:
        values, sources, _ = read_env(os.environ)
        return _expand_host((values, sources))[0]
