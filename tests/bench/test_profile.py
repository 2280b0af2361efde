"""`mqgw bench profile`: a gateway under pyinstrument while a scenario runs; the report is
the call tree of the messages' way through the gateway, written once the gateway stopped."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.harness.processes import REPO


def test_the_report_shows_the_publish_and_delivery_paths(tmp_path: Path) -> None:
    out = tmp_path / "profile.txt"
    command = [sys.executable, "-m", "mqgw_cli.main", "bench", "profile", "confirm-durable-1k"]
    done = subprocess.run(
        [*command, "--scale", "0.2", "--procs", "1", "--out", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert f"profile of the gateway (text): {out}" in done.stderr.replace("\n", "")
    report = out.read_text()
    assert '"complete": true' in done.stdout  # the scenario ran to its end against it
    # Enough messages (40k) for the delivery path to stand out of the start's imports: the
    # text report leaves out frames with a small share of the samples. A queue's turn and its
    # deliveries are compiled (plain_turn, deliver_run: no Python frames for pyinstrument to
    # see), so the writer that sends them stands for the delivery path.
    for path in ("publish_batch", "CommitLog.append", "_write_loop", "SocketStream.send"):
        assert path in report, path
