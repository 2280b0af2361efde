"""`mqgw storage check` and `mqgw storage repair`: the operator's tools for a damaged log.

check reads every commitlog record from the first segment (not only the tail recovery looks
at) and lists each problem with its segment and offset. repair makes the log openable again
while keeping every valid record: a damaged record whose extent is known becomes a hole that
readers skip, damage running to a segment's end becomes a filler, and only a damaged tail with
nothing valid after it is truncated. The damaged messages are listed; they are not recoverable.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from storage.commit_log import CommitLog
from storage.config import StoreConfig
from storage.file_system import FileSystem
from storage.log_store import LogStore, read_layout
from storage.record import BLANK_MAGIC, HOLE_MAGIC, encode_blank
from storage.recovery import next_valid_offset
from storage.segment_files import segment_name


@dataclass
class Problem:
    segment: str
    offset: int
    reason: str
    resume_at: int | None  # where valid data continues; None for a damaged tail

    def describe(self) -> str:
        where = f"{self.segment} @ {self.offset}"
        after = (
            "nothing valid after it" if self.resume_at is None else f"valid from {self.resume_at}"
        )
        return f"{where}: {self.reason} ({after})"


@dataclass
class CheckReport:
    segments: int = 0
    records: int = 0
    end_offset: int = 0
    problems: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def _open_log(config: StoreConfig, fs: FileSystem) -> CommitLog:
    commit_log = CommitLog(
        fs, config.data_dir / "commitlog", config.segment_size_bytes, config.max_record_bytes
    )
    commit_log.load()
    return commit_log


def _scan_all(commit_log: CommitLog) -> CheckReport:
    report = CheckReport(segments=len(commit_log.files.segments))
    last = commit_log.files.last
    data_end = last.end if last is not None else 0

    def count(_commit: int, _buf: bytes, _pos: int, _size: int) -> None:
        report.records += 1

    pos = commit_log.files.min_offset
    while True:
        end = commit_log.scan(pos, count)
        report.end_offset = end.offset
        if end.offset >= data_end:
            return report
        segment = segment_name(end.offset - end.offset % commit_log.segment_size)
        resume = next_valid_offset(commit_log, end.offset)
        report.problems.append(
            Problem(segment, end.offset, end.problem or "gap in the commitlog", resume)
        )
        if resume is None:
            return report
        pos = resume


def check_store(config: StoreConfig, fs: FileSystem | None = None) -> CheckReport:
    commit_log = _open_log(config, fs or FileSystem())
    try:
        return _scan_all(commit_log)
    finally:
        commit_log.close()


def repair_store(config: StoreConfig, fs: FileSystem | None = None) -> CheckReport:
    """Fix what check finds, then open the store once so indexes are rebuilt and checked."""
    fs = fs or FileSystem()
    commit_log = _open_log(config, fs)
    try:
        report = _scan_all(commit_log)
        size = commit_log.segment_size
        for problem in report.problems:
            bad = problem.offset
            segment = commit_log.files.find(bad)
            assert segment is not None
            resume = problem.resume_at
            if resume is None or resume > segment.start + 2 * size - 1:
                commit_log.truncate_from(bad)
                break
            if resume - resume % size == segment.start:
                marker = encode_blank(bad, resume - bad, 0, HOLE_MAGIC)
            else:
                marker = encode_blank(bad, segment.start + size - bad, 0, BLANK_MAGIC)
            commit_log.files.write(segment, marker, bad - segment.start)
            fs.fsync(segment.fd)
    finally:
        commit_log.close()
    # Re-dispatch everything: entries may point into what was truncated.
    (config.data_dir / "checkpoint.json").unlink(missing_ok=True)
    LogStore.open(config, fs).close()
    return report


def config_for(data_dir: Path) -> StoreConfig:
    """A config matching an existing store's layout (sizes come from its layout.json)."""
    layout = read_layout(data_dir)
    if layout is None:
        raise FileNotFoundError(f"{data_dir} holds no mqgw store (no layout.json)")
    segment_size = layout["segment_size_bytes"]
    return StoreConfig(
        data_dir,
        segment_size_bytes=segment_size,
        cq_entries_per_segment=layout["cq_entries_per_segment"],
        max_record_bytes=min(StoreConfig(data_dir).max_record_bytes, segment_size - 64),
    )
