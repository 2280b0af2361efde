"""Many nemesis reports in one table (localcluster/nemesis/summary.py): runs and clean ones,
and the confirm gaps per fault kind with their median, p99 and max."""

from __future__ import annotations

from localcluster.nemesis.summary import parse, percentile, table

REPORT = """2026-11-27 23:36:07,297 nemesis seed 2: 6 faults over 2 min in /tmp/x
nemesis seed 2, 2 min, 3 faults
  t=   9.69s lossy   r2 (18% lost, 1000 kbit/s) for 4.91s; longest confirm gap 0.04s
  t=  18.78s lossy   ctl2 (14% lost, 1000 kbit/s) for 14.72s; longest confirm gap 0.16s
  t=  37.98s isolate s3 for 13.30s; longest confirm gap 0.07s; no controller deciding 4.20s
published 18326 (confirmed 18323), delivered 18324 (0 again): clean
"""


def test_reports_add_up_per_fault_kind() -> None:
    first = parse(REPORT)
    assert first is not None and first.clean and first.seed == 2
    assert first.stalls == {"lossy": [0.04, 0.16], "isolate": [0.07]}
    assert first.blind == {"isolate": [4.2]}  # older reports: no figure
    failed = parse(
        REPORT.replace("seed 2,", "seed 5,").replace(": clean", ": FAILED").replace("0.07", "3.5")
    )
    assert failed is not None and not failed.clean
    text = table([first, failed])
    assert text.splitlines()[0] == "2 runs, 4 minutes of faults: 1 clean, FAILED: seeds 5"
    assert "| isolate | 2 | 0.07 s | 3.50 s | 3.50 s | 4.20 s | 4.20 s |" in text
    assert "| lossy | 4 | 0.04 s | 0.16 s | 0.16 s | — | — |" in text
    assert parse("a run killed before its report") is None
    # A clean history does not make a clean run (nemesis seeds 115, 122, 123).
    for mark in ("  CRASHED: b0 broker exited 1: x", "  MASTERS: 0 and 1 confirmed at one time",
                 "  the queues did not drain after the heal"):  # fmt: skip
        also = parse(REPORT.replace("published ", mark + "\npublished "))
        assert also is not None and not also.clean, mark


def test_nearest_rank_percentiles() -> None:
    values = [float(n) for n in range(1, 101)]
    assert (percentile(values, 0.5), percentile(values, 0.99), percentile(values, 1.0)) == (
        50.0,
        99.0,
        100.0,
    )
    assert percentile([7.0], 0.99) == 7.0
