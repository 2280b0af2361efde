"""Settings on the command line: a flag for every GatewaySettings field (``tls_port`` ->
``--tls-port``; booleans ``--x/--no-x``; lists and tables repeated or comma-separated), the
logging flags on every command, and `mqgw config show`.

Flags are only recorded when given (argparse.SUPPRESS), so the flag layer holds exactly what
the command line said, with the flag's name as the value's source.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterable, Iterator
from enum import Enum
from typing import Any, Literal, get_args, get_origin

from gateway.config.reference import toml_value
from gateway.config.sources import (
    HOST,
    ConfigError,
    Resolved,
    Source,
    combine,
    env_hint,
    env_name,
    flag_name,
    parse_text,
    resolve,
    setting_fields,
    value_kind,
)
from mqgw_cli.admin_target import CLIENT_ENV

DEST = "setting__"  # argparse dests of the settings flags: setting__<key>
LOG_KEYS = (
    "log_level", "log_levels", "log_console", "log_file",
    "log_file_rotation", "log_file_rotation_count", "log_format",
)  # fmt: skip
MASK = "********"


def _metavar(key: str) -> str:
    if key == "log_file_rotation":
        return "SIZE|WHEN"
    annotation = setting_fields()[key].annotation
    if get_origin(annotation) is Literal:
        return "{" + ",".join(map(str, get_args(annotation))) + "}"
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        return "{" + ",".join(str(member.value) for member in annotation) + "}"
    text = str(annotation)
    for word, metavar in (("Path", "PATH"), ("int", "N"), ("float", "N")):
        if word in text:
            return metavar
    return "TEXT"


def add_settings_flags(parser: argparse.ArgumentParser, keys: Iterable[str] | None = None) -> None:
    """A flag per setting (all, or ``keys``); the ``--host`` shorthand with all of them."""
    fields = setting_fields()
    wanted = list(fields) if keys is None else list(keys)
    title = "settings (flags > MQGW_* environment > --config file > defaults)"
    group = parser.add_argument_group(title if keys is None else "logging")
    if keys is None:
        group.add_argument(
            "--host", dest=DEST + HOST, default=argparse.SUPPRESS, metavar="ADDR",
            help=f"amqp_host and admin_host, unless given (env {env_name(HOST)})",
        )  # fmt: skip
    for key in wanted:
        names = [flag_name(key)] + (["--config-file"] if key == "config_file" else [])
        text = f"{fields[key].description} (env {env_name(key)})"
        kind = value_kind(key)
        if kind == "bool":
            group.add_argument(
                *names, dest=DEST + key, default=argparse.SUPPRESS, help=text,
                action=argparse.BooleanOptionalAction,
            )  # fmt: skip
        elif kind == "scalar":
            group.add_argument(
                *names, dest=DEST + key, default=argparse.SUPPRESS, metavar=_metavar(key), help=text
            )
        else:
            form = {"list": "A,B", "dict": "K=V,K=V", "models": "JSON"}[kind]
            group.add_argument(
                *names, dest=DEST + key, default=argparse.SUPPRESS, action="append",
                metavar=form, help=text + "; repeatable",
            )  # fmt: skip


def flags_given(args: argparse.Namespace) -> dict[str, Any]:
    """The settings given as flags, by key, parsed; ConfigError names the bad flag."""
    given: dict[str, Any] = {}
    for dest, raw in vars(args).items():
        if not dest.startswith(DEST):
            continue
        key = dest[len(DEST) :]
        try:
            if isinstance(raw, list):
                given[key] = combine(key, [parse_text(key, item) for item in raw])
            elif isinstance(raw, str):
                given[key] = parse_text(key, raw)
            else:
                given[key] = raw
        except ValueError as error:
            raise ConfigError(f"{key}: {error} (from flag {flag_name(key)})") from None
    return given


def resolve_args(args: argparse.Namespace) -> Resolved:
    return resolve(flags_given(args))


def _parsers(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    yield parser
    seen: set[int] = set()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                if id(child) not in seen:
                    seen.add(id(child))
                    yield from _parsers(child)


def add_global_flags(parser: argparse.ArgumentParser) -> None:
    """The logging flags on every command, before or after the subcommand's name."""
    for each in _parsers(parser):
        if "--log-level" not in each._option_string_actions:
            add_settings_flags(each, LOG_KEYS)


def configure_command_logging(args: argparse.Namespace) -> None:
    """Logging for the commands other than serve: the logging flags and MQGW_LOG_* only
    (an unrelated bad MQGW_* value does not stop `mqgw ctl`)."""
    from gateway.config.logging_setup import configure_from_settings
    from gateway.config.sources import build, read_env

    env_values, env_sources, _ = read_env(os.environ)
    values = {k: v for k, v in env_values.items() if k in LOG_KEYS}
    flags = flags_given(args)
    values.update({k: v for k, v in flags.items() if k in LOG_KEYS})
    sources = {**env_sources, **{k: Source("flag", flag_name(k)) for k in flags}}
    configure_from_settings(build(values, sources))


# -- mqgw config show -------------------------------------------------------------------


def effective(resolved: Resolved) -> list[tuple[str, Any, Source]]:
    """(key, value, source) for every setting; passwords masked."""
    dumped = resolved.settings.model_dump(mode="json")
    rows = []
    for key in setting_fields():
        value = dumped[key]
        if key == "users":
            value = [{**user, "password": MASK} for user in value]
        rows.append((key, value, resolved.source(key)))
    return rows


def show(args: argparse.Namespace) -> int:
    try:
        resolved = resolve_args(args)
    except ConfigError as error:
        print(f"mqgw config show: configuration error: {error}", file=sys.stderr)
        return 2
    for var in resolved.unknown_env:
        if var not in CLIENT_ENV:  # the operator commands' own (MQGW_ADMIN_URL, ...)
            print(
                f"mqgw config show: {var} names no setting: ignored{env_hint(var)}", file=sys.stderr
            )
    for key, value, source in effective(resolved):
        if args.json:
            print(json.dumps({"key": key, "value": value, "source": str(source)}))
        elif value is None:
            print(f"# {key} is not set  # {source}")
        else:
            print(f"{key} = {toml_value(value)}  # {source}")
    return 0


def add_config_commands(commands: Any) -> None:
    config = commands.add_parser("config", help="the gateway's settings")
    config_cmds = config.add_subparsers(dest="command", required=True)
    sub = config_cmds.add_parser(
        "show",
        help="the effective settings of `mqgw serve` with these flags, and each one's source",
    )
    sub.add_argument("--json", action="store_true", help="one JSON object per setting")
    add_settings_flags(sub)
    sub.set_defaults(func=show, configures_logging=True)  # prints; opens no log file
