"""`mqgw replay capture|run|reconcile`: migrate traffic onto mqgw (docs/migration.md).

    mqgw replay capture --source amqp://u:p@rabbit:5672/vhost --out DIR [--duration S]
    mqgw replay run --capture PATH --format rabbitmq-trace|firehose|mqgw-log
        --target amqp://u:p@host:port/vhost [--speed X | --rate N] [--order-key K]
        [--from T --to T] [--master URL] [--resume] --out DIR
    mqgw replay reconcile --capture PATH --format F (--store TARGET_DATA_DIR | --cluster D)
        --out DIR

Exit codes: run 0 when every message was sent (nacks and returns are results, listed in
results.parquet), 1 when the run stopped early (Ctrl-C, lost target), 2 on bad input or an
unreachable target. reconcile 0 only when nothing is missing, misrouted or out of order,
1 otherwise, 2 on bad input.
"""

from __future__ import annotations

import argparse
import sys
import threading
from pathlib import Path
from typing import Any


def _err(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _time(text: str) -> int:
    from replay.sources import parse_time_option

    value = parse_time_option(text)
    if value is None:
        raise argparse.ArgumentTypeError("empty time")
    return value


def _speed(text: str) -> float:
    from replay.pacing import parse_speed

    try:
        return parse_speed(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _progress_printer() -> Any:
    """A rich bar on a terminal, else a line on stderr about once a second."""
    import time

    state = {"last": 0.0}

    def show(p: dict[str, Any]) -> None:
        now = time.monotonic()
        if now - state["last"] < 1.0:
            return
        state["last"] = now
        _err(
            f"replay: {p['sent']}/{p['total']} sent, {p['confirmed']} confirmed, "
            f"max schedule lag {p['max_lag_ms']:.0f} ms"
        )

    if not sys.stderr.isatty():
        return show, None
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    bar = Progress(
        TextColumn("replay"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[confirmed]} confirmed, lag max {task.fields[lag]:.0f} ms"),
        console=Console(stderr=True),
        transient=True,
    )
    task = bar.add_task("replay", total=None, confirmed=0, lag=0.0)

    def update(p: dict[str, Any]) -> None:
        bar.update(
            task,
            completed=p["sent"],
            total=p["total"],
            confirmed=p["confirmed"],
            lag=p["max_lag_ms"],
        )

    return update, bar


def run(args: argparse.Namespace) -> int:
    from replay.run import RunOptions, TargetUnreachable, check_target, run_replay

    try:
        check_target(args.target)  # before Spark starts: an unreachable target fails fast
    except TargetUnreachable as error:
        _err(f"mqgw replay run: {error}")
        return 2
    if not Path(args.capture).exists():
        _err(f"mqgw replay run: {args.capture}: no such capture")
        return 2
    from pyspark import InheritableThread

    from replay.spark import build_session

    options = RunOptions(
        capture=Path(args.capture),
        fmt=args.format,
        target=args.target,
        out=Path(args.out),
        speed=args.speed,
        rate=args.rate,
        order_key=args.order_key,
        from_ms=args.from_ms,
        to_ms=args.to_ms,
        resume=args.resume,
        senders=args.senders,
    )
    spark = build_session(args.master)
    stop = threading.Event()
    show, bar = _progress_printer()
    try:
        if bar is not None:
            bar.start()
        result: list[Any] = []
        failed: list[BaseException] = []

        def work() -> None:
            try:
                result.append(run_replay(spark, options, show, stop))
            except BaseException as error:  # re-raised below, in the main thread
                failed.append(error)

        worker = InheritableThread(target=work, daemon=True)  # Spark-safe thread
        worker.start()
        while worker.is_alive():
            try:
                worker.join(0.2)
            except KeyboardInterrupt:
                _err("replay: stopping after the messages in flight")
                stop.set()
        if failed:
            raise failed[0]
    except (TargetUnreachable, ValueError, FileNotFoundError) as error:
        _err(f"mqgw replay run: {error}")
        return 2
    finally:
        if bar is not None:
            bar.stop()
    if not result:
        _err("mqgw replay run: failed (see the Spark error above)")
        return 2
    summary = result[0]
    for item in summary.malformed[:20]:
        _err(f"malformed: {item['source_file']}:{item['line']}: {item['error']}")
    print(
        f"replayed {summary.sent} of {summary.messages} message(s) in {summary.seconds:.1f} s: "
        f"{summary.confirmed} confirmed, {summary.nacked} nacked, {summary.returned} returned, "
        f"{summary.errors} failed; {len(summary.malformed)} malformed line(s); "
        f"{summary.skipped_confirmed} skipped (confirmed before); results in "
        f"{Path(args.out) / 'results.parquet'}"
    )
    for failure in summary.failures:
        _err(f"a sender stopped: {failure}")
    return 1 if summary.stopped or summary.sent < summary.messages else 0


def reconcile(args: argparse.Namespace) -> int:
    from replay.log_reader import is_cluster_dir

    target = Path(args.store or args.cluster)
    if args.cluster is not None and not is_cluster_dir(target):
        _err(f"mqgw replay reconcile: {target}: no cluster.json (not a `mqgw cluster up` dir)")
        return 2
    if args.store is not None and is_cluster_dir(target):
        _err(f"mqgw replay reconcile: {target} is a cluster dir: give it as --cluster")
        return 2
    from localcluster.layout import ClusterError
    from meta.errors import MetadataUnavailable
    from replay.reconcile import ReconcileOptions
    from replay.reconcile import reconcile as run_reconcile
    from replay.spark import build_session

    options = ReconcileOptions(
        capture=Path(args.capture),
        fmt=args.format,
        store=target,
        out=Path(args.out),
        results=Path(args.results) if args.results else None,
        order_key=args.order_key,
        from_ms=args.from_ms,
        to_ms=args.to_ms,
    )
    try:
        report = run_reconcile(build_session(args.master), options)
    except (ValueError, FileNotFoundError, MetadataUnavailable, ClusterError) as error:
        _err(f"mqgw replay reconcile: {error}")
        return 2
    totals = report["totals"]
    print(
        f"{totals['arrived']} of {totals['expected']} expected deliveries arrived; missing "
        f"{totals['missing']}, duplicated {totals['duplicated']}, misrouted "
        f"{totals['misrouted']}, out of order {totals['order_violations']}, body mismatches "
        f"{totals['body_mismatches']}, property mismatches {totals['property_mismatches']}; "
        f"{report['capture']['malformed']} malformed capture line(s) ({report['seconds']:.1f} s)"
    )
    print(f"report: {Path(args.out) / 'report.json'}, {Path(args.out) / 'report.html'}")
    return 0 if report["ok"] else 1


def capture(args: argparse.Namespace) -> int:
    from replay.capture import CaptureOptions
    from replay.capture import capture as run_capture

    options = CaptureOptions(
        args.source, Path(args.out), args.management, args.duration, args.count
    )
    try:
        writer = run_capture(options)
    except KeyboardInterrupt:
        _err("capture: stopped; tracing switched off")
        return 0
    except (OSError, RuntimeError) as error:
        _err(f"mqgw replay capture: {error}")
        return 2
    print(f"captured {writer.written} publish(es) into {args.out} ({writer.errors} unusable)")
    return 0


def add_replay_commands(commands: Any) -> None:
    replay = commands.add_parser("replay", help="capture, replay and reconcile traffic (migration)")
    cmds = replay.add_subparsers(dest="command", required=True)
    formats = ("rabbitmq-trace", "firehose", "mqgw-log")

    sub = cmds.add_parser("run", help="send a capture to a target, paced and in order")
    sub.add_argument("--capture", required=True, help="trace file/dir, capture dir or data dir")
    sub.add_argument("--format", required=True, choices=formats)
    sub.add_argument("--target", required=True, help="amqp://user:pw@host:port/vhost")
    pace = sub.add_mutually_exclusive_group()
    pace.add_argument("--speed", type=_speed, default=1.0, help="factor, or max (default 1)")
    pace.add_argument("--rate", type=float, default=None, help="fixed msgs/s over all senders")
    sub.add_argument("--order-key", default="channel", help="channel | routing-key | header:NAME")
    sub.add_argument("--senders", type=int, default=None, help="Spark tasks (default: cores)")
    sub.add_argument("--resume", action="store_true", help="skip what --out says was confirmed")
    _add_common(sub)
    sub.set_defaults(func=run)

    sub = cmds.add_parser("reconcile", help="compare a target's log with the capture")
    sub.add_argument("--capture", required=True)
    sub.add_argument("--format", required=True, choices=formats)
    where = sub.add_mutually_exclusive_group(required=True)
    where.add_argument("--store", help="the target gateway's data dir")
    where.add_argument("--cluster", help="a `mqgw cluster up --dir` dir: every broker group's log")
    sub.add_argument("--results", default=None, help="the run's --out (default: --out)")
    sub.add_argument("--order-key", default=None, help="default: the run's")
    _add_common(sub)
    sub.set_defaults(func=reconcile)

    sub = cmds.add_parser("capture", help="record publishes from the firehose to Parquet")
    sub.add_argument("--source", required=True, help="amqp://user:pw@host:port/vhost")
    sub.add_argument("--out", required=True)
    sub.add_argument("--management", default=None, help="HTTP API (default http://HOST:15672)")
    sub.add_argument("--duration", type=float, default=None, help="seconds (default: Ctrl-C)")
    sub.add_argument("--count", type=int, default=None, help="stop after N publishes")
    sub.set_defaults(func=capture)


def _add_common(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("--from", dest="from_ms", type=_time, default=None, help="ISO time or ms")
    sub.add_argument("--to", dest="to_ms", type=_time, default=None, help="ISO time or ms")
    sub.add_argument("--master", default=None, help="Spark master (default local[*])")
    sub.add_argument("--out", required=True)
