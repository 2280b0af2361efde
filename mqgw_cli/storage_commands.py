"""`mqgw storage check|repair DATA_DIR`: verify, or mend, a stopped node's log store.

DATA_DIR is the data directory `mqgw serve` was started with (it holds store/ and meta/) or
its store/ directory. Both commands take the store's lock first and refuse (exit 2) while a
node has the store open. Progress goes to stderr about once a second (a bar on a terminal);
the findings and a summary go to stdout. Exit codes: 0 clean (or repaired), 1 damage found
(check) or damage left (repair), 2 refused or failed (not a store, in use, unreadable).
docs/operations.md says when to run them: check first, copy the store, then repair.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TextIO

from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeElapsedColumn

from storage.errors import StoreError
from storage.log.check import CheckReport, ScanProgress, StoreToolError, check_dir, find_store_dir
from storage.log.repair import repair_dir

Reporter = Callable[[ScanProgress], None]


def human_bytes(count: int) -> str:
    if count < 1024:
        return f"{count} B"
    value = count / 1024
    units = ["KiB", "MiB", "GiB", "TiB"]
    while value >= 1024 and len(units) > 1:
        value /= 1024
        units.pop(0)
    return f"{value:.1f} {units[0]}"


class ProgressLines:
    """Plain progress lines on a stream, at most one per ``interval_s`` (0: every update).
    The last update is printed too once any line was, so a long scan ends at 100%."""

    def __init__(self, verb: str, interval_s: float, stream: TextIO) -> None:
        self.verb = verb
        self.interval_s = interval_s
        self.stream = stream
        self.started = time.monotonic()
        self.last_line = self.started
        self.printed = False

    def __call__(self, p: ScanProgress) -> None:
        now = time.monotonic()
        finished = p.segments_done == p.segments_total
        due = now - self.last_line >= self.interval_s
        if not (due or (finished and self.printed)):
            return
        self.last_line = now
        self.printed = True
        share = f" ({100 * p.bytes_done // p.bytes_total}%)" if p.bytes_total else ""
        print(
            f"{self.verb}: segment {min(p.segments_done + 1, p.segments_total)}/"
            f"{p.segments_total}, {human_bytes(p.bytes_done)} of {human_bytes(p.bytes_total)}"
            f"{share}, {p.records} records, {now - self.started:.0f} s",
            file=self.stream,
            flush=True,
        )


@contextmanager
def progress_reporter(verb: str, interval_s: float) -> Iterator[Reporter]:
    """A rich bar when stderr is a terminal, else ProgressLines on stderr."""
    if not sys.stderr.isatty() or interval_s <= 0:
        yield ProgressLines(verb, interval_s, sys.stderr)
        return
    bar = Progress(
        TextColumn(verb),
        BarColumn(),
        DownloadColumn(binary_units=True),
        TextColumn("{task.fields[segments]} segments, {task.fields[records]} records"),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=True,
    )
    task = bar.add_task(verb, total=None, segments="0/?", records=0)

    def update(p: ScanProgress) -> None:
        segments = f"{min(p.segments_done + 1, p.segments_total)}/{p.segments_total}"
        bar.update(
            task, completed=p.bytes_done, total=p.bytes_total, segments=segments, records=p.records
        )

    with bar:
        yield update


def _summary(args: argparse.Namespace, report: CheckReport, seconds: float) -> int:
    repair = args.command == "repair"
    print(
        f"{report.segments} segment(s), {human_bytes(report.bytes)}, {report.records} valid "
        f"record(s), end of valid data at offset {report.end_offset} ({seconds:.1f} s)"
    )
    verb = "repaired" if repair else "found"
    for problem in report.problems:
        print(f"{verb}: {problem.describe()}")
    if repair and report.recovery is not None:
        print(
            f"indexes rebuilt: {report.recovery.redispatched} consume-queue entries written, "
            f"{report.recovery.cq_entries_dropped} dropped"
        )
    if report.ok:
        print("ok: no damaged records")
        return 0
    if repair:
        print(f"ok: {len(report.problems)} damaged place(s) repaired; the store opens again")
        return 0
    print(
        f"{len(report.problems)} damaged place(s): copy the store, then run "
        f"`mqgw storage repair {args.data_dir}` (docs/operations.md)"
    )
    return 1


def run_storage_tool(args: argparse.Namespace) -> int:
    repair = args.command == "repair"
    name = f"mqgw storage {args.command}"
    path = Path(args.data_dir)
    started = time.monotonic()
    try:
        store_dir = find_store_dir(path)
        print(f"{'repairing' if repair else 'checking'} the store at {store_dir}", file=sys.stderr)
        with progress_reporter(args.command, args.progress_interval) as progress:
            report = repair_dir(path, progress, _note) if repair else check_dir(path, progress)
    except StoreToolError as error:
        print(f"{name}: {error}", file=sys.stderr)
        return 2
    except StoreError as error:  # repair found damage it could not mend
        print(f"{name}: {error}", file=sys.stderr)
        return 1
    except (OSError, ValueError) as error:
        print(f"{name}: cannot read the store at {path}: {error}", file=sys.stderr)
        return 2
    return _summary(args, report, time.monotonic() - started)


def _note(text: str) -> None:
    print(text, file=sys.stderr, flush=True)  # under a rich bar, printed above it


def add_storage_commands(commands: Any) -> None:
    storage = commands.add_parser(
        "storage", help="check or repair a stopped node's log store (docs/operations.md)"
    )
    storage_cmds = storage.add_subparsers(dest="command", required=True)
    for name, text in (
        ("check", "verify every commitlog record (CRC, size, offsets); exit 1 on damage"),
        ("repair", "make a damaged store openable, keeping every valid record"),
    ):
        sub = storage_cmds.add_parser(name, help=text, description=text)
        sub.add_argument(
            "data_dir",
            metavar="DATA_DIR",
            help="the data dir `mqgw serve` uses (holding store/ and meta/), or its store/",
        )
        sub.add_argument(
            "--progress-interval",
            type=float,
            default=1.0,
            metavar="SECONDS",
            help="seconds between progress lines on stderr (default 1; 0: every step)",
        )
        sub.set_defaults(func=run_storage_tool)
