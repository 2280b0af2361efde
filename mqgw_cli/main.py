"""`mqgw`: one entry point for every process and tool of the project."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from mqgw_cli.ctl_commands import add_ctl_commands
from mqgw_cli.definitions_commands import add_definitions_commands
from mqgw_cli.queue_commands import add_queue_commands


def _storage_check(args: argparse.Namespace) -> int:
    from storage.check import check_store, config_for, repair_store

    config = config_for(Path(args.data_dir))
    report = repair_store(config) if args.command == "repair" else check_store(config)
    verb = "repaired" if args.command == "repair" else "found"
    print(
        f"{report.segments} segment(s), {report.records} valid record(s), "
        f"end of valid data at offset {report.end_offset}"
    )
    for problem in report.problems:
        print(f"{verb}: {problem.describe()}")
    if report.ok:
        print("ok: no damaged records")
        return 0
    return 0 if args.command == "repair" else 1


def _bench_store(args: argparse.Namespace) -> int:
    from bench.store_bench import run

    run(args.data_dir, args.seconds, args.backlog, args.quick, args.json)
    return 0


def _serve(args: argparse.Namespace) -> int:
    from gateway.server import run
    from gateway.settings import GatewaySettings

    settings = GatewaySettings.load(
        args.config,
        amqp_host=args.host,
        admin_host=args.host,
        amqp_port=args.amqp_port,
        admin_port=args.admin_port,
        data_dir=args.data_dir,
    )
    run(settings, args.backend)
    return 0


def _bench_roundtrip(args: argparse.Namespace) -> int:
    from bench.roundtrip import run

    run(args.url, args.count, args.size, args.rounds)
    return 0


def _bench_run(args: argparse.Namespace) -> int:
    from bench.load.compare import run

    run(args.scenarios, args.url, args.scale, args.procs)
    return 0


def _bench_compare(args: argparse.Namespace) -> int:
    from bench.load.compare import compare

    if not args.with_rabbitmq and not args.compare:
        raise SystemExit("mqgw bench compare: give --compare URL_A URL_B or --with-rabbitmq")
    compare(args.scenarios, args.compare, args.scale, args.rounds, args.procs)
    return 0


def _add_load_options(sub: argparse.ArgumentParser) -> None:
    from bench.load.runner import default_procs
    from bench.load.scenarios import SCENARIOS

    sub.add_argument(
        "scenarios", nargs="*", metavar="SCENARIO", help=f"default: all ({', '.join(SCENARIOS)})"
    )
    sub.add_argument("--scale", type=float, default=1.0, help="shrink message counts (0.1)")
    sub.add_argument("--procs", type=int, default=default_procs(), help="worker processes per role")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mqgw", description=__doc__)
    parser.add_argument("--log-level", default="INFO")
    commands = parser.add_subparsers(dest="process", required=True)

    serve = commands.add_parser("serve", help="run an embedded gateway node (AMQP + admin)")
    serve.add_argument("--config", type=Path, default=None, help="TOML settings file")
    serve.add_argument(
        "--host", default=None, help="listen address for AMQP and admin (default 0.0.0.0)"
    )
    serve.add_argument("--amqp-port", type=int, default=None, help="default 5672")
    serve.add_argument("--admin-port", type=int, default=None, help="default 15672; 0: off")
    serve.add_argument("--data-dir", type=Path, default=None, help="default ./data")
    serve.add_argument("--backend", choices=("asyncio", "trio"), default="asyncio")
    serve.set_defaults(func=_serve)

    storage = commands.add_parser("storage", help="inspect and repair a log store directory")
    storage_cmds = storage.add_subparsers(dest="command", required=True)
    for name, text in (
        ("check", "verify every commitlog record (CRC, size, offsets); exit 1 on damage"),
        ("repair", "make a damaged store openable, keeping every valid record"),
    ):
        sub = storage_cmds.add_parser(name, help=text)
        sub.add_argument("data_dir", help="the store directory (e.g. ./data/store)")
        sub.set_defaults(func=_storage_check)

    add_queue_commands(commands)
    add_ctl_commands(commands)
    add_definitions_commands(commands)

    bench = commands.add_parser("bench", help="benchmarks")
    bench_cmds = bench.add_subparsers(dest="command", required=True)
    store = bench_cmds.add_parser("store", help="log store appends, reads and catch-up")
    store.add_argument("--seconds", type=float, default=3.0, help="per append run")
    store.add_argument("--backlog", type=int, default=10_000_000, help="catch-up records (0: skip)")
    store.add_argument("--quick", action="store_true", help="100 B records only")
    store.add_argument("--data-dir", type=Path, default=None, help="scratch dir (default: tmp)")
    store.add_argument("--json", type=Path, default=None, help="also write the JSON lines here")
    store.set_defaults(func=_bench_store)
    trip = bench_cmds.add_parser("roundtrip", help="aio-pika confirms + consumer, side by side")
    trip.add_argument("--url", action="append", required=True, help="AMQP URL (give two)")
    trip.add_argument("--count", type=int, default=20_000)
    trip.add_argument("--size", type=int, default=1024)
    trip.add_argument("--rounds", type=int, default=3)
    trip.set_defaults(func=_bench_roundtrip)
    load = bench_cmds.add_parser("run", help="raw-socket load scenarios against one server")
    _add_load_options(load)
    load.add_argument("--url", default=None, help="AMQP URL (default: start a gateway)")
    load.set_defaults(func=_bench_run)
    side = bench_cmds.add_parser("compare", help="scenarios against A and B alternately")
    _add_load_options(side)
    which = side.add_mutually_exclusive_group()
    which.add_argument("--compare", nargs=2, metavar=("URL_A", "URL_B"), default=None)
    which.add_argument(
        "--with-rabbitmq",
        action="store_true",
        help="start the gateway (sync flush) as A and a private RabbitMQ as B",
    )
    side.add_argument("--rounds", type=int, default=3)
    side.set_defaults(func=_bench_compare)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
