"""`mqgw`: one entry point for every process and tool of the project."""

from __future__ import annotations

import argparse
import importlib.metadata
import logging
import sys
from collections.abc import Sequence
from typing import Any

from gateway.config.sources import ConfigError, env_hint
from mqgw_cli.admin_target import CLIENT_ENV
from mqgw_cli.bench_commands import add_bench_commands
from mqgw_cli.broker_command import add_broker_command
from mqgw_cli.cluster_commands import add_cluster_commands
from mqgw_cli.config_commands import (
    add_config_commands,
    add_global_flags,
    add_settings_flags,
    configure_command_logging,
    resolve_args,
)
from mqgw_cli.controller_command import add_controller_command
from mqgw_cli.ctl_commands import add_ctl_commands
from mqgw_cli.definitions_commands import add_definitions_commands
from mqgw_cli.queue_commands import add_queue_commands
from mqgw_cli.replay_commands import add_replay_commands
from mqgw_cli.rocketmq_commands import add_rocketmq_commands
from mqgw_cli.sim_commands import add_sim_commands
from mqgw_cli.storage_commands import add_storage_commands

log = logging.getLogger("mqgw.server")


def _serve(args: argparse.Namespace) -> int:
    from gateway.config.logging_setup import configure_from_settings
    from gateway.server import run

    try:
        resolved = resolve_args(args)
        configure_from_settings(resolved.settings)
    except (ConfigError, OSError, ValueError) as error:
        print(f"mqgw serve: configuration error: {error}", file=sys.stderr)
        return 2
    for var in resolved.unknown_env:
        if var not in CLIENT_ENV:  # the operator commands' own (MQGW_ADMIN_URL, ...)
            log.warning("environment variable %s names no setting: ignored%s", var, env_hint(var))
    if args.workers != 1:  # the cluster topology on this host: mqgw_cli/serve_workers.py
        from mqgw_cli.serve_workers import run as run_workers

        return run_workers(args, resolved.settings)
    run(resolved.settings, args.backend)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mqgw", description=__doc__)
    parser.add_argument(
        "--version",
        action=_VersionAction,
        help="show the version and whether the compiled hot paths are in use, and exit",
    )
    commands = parser.add_subparsers(dest="process", required=True)

    _add_serve_command(commands)
    add_config_commands(commands)

    add_storage_commands(commands)
    add_broker_command(commands)
    add_controller_command(commands)
    add_sim_commands(commands)
    add_cluster_commands(commands)
    add_rocketmq_commands(commands)
    add_queue_commands(commands)
    add_ctl_commands(commands)
    add_definitions_commands(commands)
    add_replay_commands(commands)

    add_bench_commands(commands)
    add_global_flags(parser)  # after every subcommand exists: --log-level etc. on each
    return parser


def _add_serve_command(commands: Any) -> None:
    serve = commands.add_parser(
        "serve",
        help="run an embedded gateway node (AMQP + admin)",
        description="Every setting is a flag here; docs/configuration.md lists them.",
    )
    serve.add_argument("--backend", choices=("asyncio", "trio"), default="asyncio")
    serve.add_argument(
        "--workers",
        type=int,
        default=1,
        metavar="N",
        help="N ≥ 2: N gateway processes on one port (SO_REUSEPORT) over a local broker and "
        "Redis, all supervised by this command (default 1: one embedded node)",
    )
    add_settings_flags(serve)
    serve.set_defaults(func=_serve, configures_logging=True)


def _version() -> str:
    try:
        return importlib.metadata.version("mqgw")
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed)"


class _VersionAction(argparse.Action):
    """``mqgw --version``: the installed version, then ``compiled hot paths: yes`` or ``no
    (reason)`` on its own line (storage/twins.py), looked up only when asked."""

    def __init__(self, option_strings: Sequence[str], dest: str, help: str | None = None) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help=help)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        from storage.twins import status_line

        print(f"mqgw {_version()}\n{status_line()}")
        parser.exit()


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not getattr(args, "configures_logging", False):
        try:
            configure_command_logging(args)
        except (ConfigError, OSError, ValueError) as error:
            print(f"mqgw: configuration error: {error}", file=sys.stderr)
            return 2
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
