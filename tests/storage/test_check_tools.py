"""`mqgw storage check|repair`: which directories they accept, the lock, the record limit
from the store's layout, what repair does to damage, and the lines they print."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mqgw_cli.storage_commands import add_storage_commands
from storage import LogStore, ReadStatus, StoreConfig, StoreLocked
from storage.log.check import StoreToolError, check_dir, check_store, config_for, record_limit
from storage.log.repair import repair_dir
from tests.harness.processes import REPO
from tests.storage.helpers import rec

SEGMENT = 4096


def cli(*argv: str) -> int:
    parser = argparse.ArgumentParser()
    add_storage_commands(parser.add_subparsers(dest="process", required=True))
    args = parser.parse_args(["storage", *argv])
    result: int = args.func(args)
    return result


def run_mqgw(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mqgw_cli.main", *argv],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )


def make_store(data_dir: Path, count: int = 60, segment: int = SEGMENT) -> list[int]:
    """A serve-style data dir (store/ and meta/) with ``count`` one-record batches on queue 1."""
    (data_dir / "meta").mkdir(parents=True)
    config = StoreConfig(
        data_dir / "store",
        segment_size_bytes=segment,
        cq_entries_per_segment=16,
        max_record_bytes=1024,
    )
    store = LogStore.open(config)
    store.create_queue(1, 1)
    offsets = [store.append([rec(b"r%03d" % i, (1, 0))]).start_offset for i in range(count)]
    store.close()
    return offsets


def flip_byte(store_dir: Path, offset: int, segment: int = SEGMENT) -> None:
    start = offset - offset % segment
    with open(store_dir / "commitlog" / f"{start:020d}", "r+b") as f:
        f.seek(offset - start)
        byte = f.read(1)
        f.seek(offset - start)
        f.write(bytes([byte[0] ^ 0xFF]))


def read_all(store_dir: Path) -> list[bytes]:
    """Every readable body of queue 1, moving past skipped (lost) messages like a consumer."""
    store = LogStore.open(config_for(store_dir))
    try:
        found: list[bytes] = []
        offset = 0
        while True:
            result = store.read(1, 0, offset, max_count=1000, max_bytes=64 << 20)
            if result.status is ReadStatus.NO_NEW_MESSAGE:
                return found
            found += [bytes(m.body) for m in result.messages]
            offset = result.next_offset
    finally:
        store.close()


def snapshot(directory: Path) -> dict[str, bytes]:
    return {
        p.relative_to(directory).as_posix(): p.read_bytes()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


def test_both_tools_accept_the_serve_data_dir_and_the_store_dir(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "data"
    make_store(data, 60)
    for path in (data, data / "store"):
        assert cli("check", str(path)) == 0
        assert cli("repair", str(path)) == 0
    out = capsys.readouterr().out
    assert out.count("60 valid record(s)") == 4
    assert read_all(data / "store") == [b"r%03d" % i for i in range(60)]


@pytest.mark.parametrize("case", ["empty", "garbage", "missing", "file", "no_layout", "bad_layout"])
def test_anything_but_a_store_is_refused_with_exit_2_and_no_traceback(
    tmp_path: Path, case: str
) -> None:
    target = tmp_path / case
    if case == "empty":
        target.mkdir()
    elif case == "garbage":
        (target / "commitlog").mkdir(parents=True)
        (target / "notes.txt").write_bytes(os.urandom(100))
    elif case == "file":
        target.write_text("not a directory")
    elif case == "no_layout":
        (target / "store" / "commitlog").mkdir(parents=True)  # a data dir never opened
    elif case == "bad_layout":
        (target / "store").mkdir(parents=True)
        (target / "store" / "layout.json").write_text("{not json")
    for command in ("check", "repair"):
        result = run_mqgw("storage", command, str(target))
        assert result.returncode == 2, result
        assert "Traceback" not in result.stderr
        assert f"mqgw storage {command}: " in result.stderr
        assert str(target) in result.stderr
    if case == "bad_layout":
        assert "layout.json is unreadable" in result.stderr
    elif case in ("empty", "garbage", "no_layout"):
        assert "holds no mqgw store" in result.stderr


def test_a_20_mib_record_in_64_mib_segments_checks_clean_and_real_damage_is_found(
    tmp_path: Path,
) -> None:
    """Written by a node whose max_message_size_bytes was raised: the tool's limit comes from
    the layout (64 MiB segments), not from the 16 MiB default."""
    segment = 64 << 20
    config = StoreConfig(
        tmp_path / "store", segment_size_bytes=segment, max_record_bytes=(20 << 20) + (64 << 10)
    )
    store = LogStore.open(config)
    store.create_queue(1, 1)
    big = bytes(range(256)) * (20 << 12)  # 20 MiB
    offsets = [store.append([rec(body, (1, 0))]).start_offset for body in (b"small", big, b"after")]
    store.close()
    assert config_for(config.data_dir).max_record_bytes == record_limit(segment)

    report = check_store(config_for(config.data_dir))
    assert report.ok and report.records == 3
    assert cli("check", str(config.data_dir)) == 0

    flip_byte(config.data_dir, offsets[1] + (10 << 20), segment)  # inside the big body
    report = check_dir(config.data_dir)
    assert [(p.offset, p.reason, p.resume_at) for p in report.problems] == [
        (offsets[1], "crc mismatch", offsets[2])
    ]
    assert cli("check", str(config.data_dir)) == 1
    assert cli("repair", str(config.data_dir)) == 0
    assert check_dir(config.data_dir).ok
    assert read_all(config.data_dir) == [b"small", b"after"]


def test_a_held_lock_refuses_both_tools_and_changes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "data"
    make_store(data, 30)
    before = snapshot(data)
    holder = LogStore.open(config_for(data))  # as a running node holds it
    try:
        in_use = rf"in use by a running node \(pid {os.getpid()}\)"
        for tool in (check_dir, repair_dir):
            with pytest.raises(StoreToolError, match=in_use):
                tool(data)
        assert cli("check", str(data)) == 2
        assert cli("repair", str(data / "store")) == 2
    finally:
        holder.close()
    err = capsys.readouterr().err
    assert f"the store at {data / 'store'} is in use by a running node (pid {os.getpid()})" in err
    after = snapshot(data)
    assert after.keys() == before.keys()
    assert {k for k in after if after[k] != before[k]} <= {"store/checkpoint.json"}  # holder's
    assert cli("check", str(data)) == 0  # free again


def test_repair_holds_the_lock_until_the_indexes_are_rebuilt(tmp_path: Path) -> None:
    data = tmp_path / "data"
    offsets = make_store(data, 40)
    flip_byte(data / "store", offsets[20] + 60)
    refused: list[str] = []

    def note(text: str) -> None:
        with pytest.raises(StoreLocked):
            LogStore.open(config_for(data))
        refused.append(text)

    report = repair_dir(data, note=note)
    assert refused and len(report.problems) == 1
    LogStore.open(config_for(data)).close()  # released at the end


def test_a_damaged_size_field_loses_only_that_record(tmp_path: Path) -> None:
    """The size field is what leads to the next record; valid data after it is found by its
    magic and self-describing offset, so repair does not drop the rest of the segment."""
    data = tmp_path / "data"
    offsets = make_store(data, 60)
    bad = offsets[10]
    path = data / "store" / "commitlog" / f"{bad - bad % SEGMENT:020d}"
    with open(path, "r+b") as f:
        f.seek(bad % SEGMENT)
        f.write((500).to_bytes(4, "little"))
    report = check_dir(data)
    assert [(p.offset, p.resume_at) for p in report.problems] == [(bad, offsets[11])]
    repair_dir(data)
    assert check_dir(data).ok
    assert read_all(data / "store") == [b"r%03d" % i for i in range(60) if i != 10]


def test_damage_running_to_a_segment_end_seals_it_and_consumers_move_on(tmp_path: Path) -> None:
    data = tmp_path / "data"
    offsets = make_store(data, 80)
    last_in_first = max(i for i, o in enumerate(offsets) if o < SEGMENT)
    flip_byte(data / "store", offsets[last_in_first] + 60)
    filler_at = (data / "store" / "commitlog" / f"{0:020d}").stat().st_size - 28
    flip_byte(data / "store", filler_at + 20)  # the filler's checksum no longer matches
    report = check_dir(data)
    assert [(p.offset, p.resume_at) for p in report.problems] == [(offsets[last_in_first], SEGMENT)]
    repaired = repair_dir(data)
    assert "sealed" in repaired.problems[0].action
    assert check_dir(data).ok
    assert read_all(data / "store") == [b"r%03d" % i for i in range(80) if i != last_in_first]
    store = LogStore.open(config_for(data))
    assert store.commit_log.sealed_ts_ms[0] > 0  # stamped: retention does not see it as ancient
    store.close()


def test_a_missing_segment_file_is_recreated_sealed_and_its_messages_skipped(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    offsets = make_store(data, 200)  # four segments
    (data / "store" / "commitlog" / f"{SEGMENT:020d}").unlink()
    report = check_dir(data)
    assert [(p.offset, p.reason, p.resume_at) for p in report.problems] == [
        (SEGMENT, "gap in the commitlog", 2 * SEGMENT)
    ]
    repair_dir(data)
    assert check_dir(data).ok
    kept = [b"r%03d" % i for i, o in enumerate(offsets) if not SEGMENT <= o < 2 * SEGMENT]
    assert read_all(data / "store") == kept


def test_progress_and_summary_lines(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "data"
    offsets = make_store(data, 1500, segment=64 << 10)
    assert cli("check", str(data), "--progress-interval", "0") == 0
    out, err = capsys.readouterr()
    assert f"checking the store at {data / 'store'}" in err
    progress = [line for line in err.splitlines() if line.startswith("check: segment ")]
    assert len(progress) >= 2  # one per 1024 records here, and the last one
    assert "(100%), 1500 records" in progress[-1]
    assert "1500 valid record(s)" in out and out.rstrip().endswith("ok: no damaged records")

    flip_byte(data / "store", offsets[700] + 60, segment=64 << 10)
    assert cli("check", str(data)) == 1
    out = capsys.readouterr().out
    assert f"found: {0:020d} @ {offsets[700]}: crc mismatch (valid from {offsets[701]})" in out
    assert f"1 damaged place(s): copy the store, then run `mqgw storage repair {data}`" in out

    assert cli("repair", str(data), "--progress-interval", "0") == 0
    out, err = capsys.readouterr()
    assert "repair: segment " in err and "rebuilding the indexes" in err
    assert f"repaired: {0:020d} @ {offsets[700]}: crc mismatch" in out
    assert "replaced by a hole of" in out and "indexes rebuilt:" in out
    assert out.rstrip().endswith("ok: 1 damaged place(s) repaired; the store opens again")
