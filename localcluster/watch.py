"""`python -m localcluster.watch D`: keep D/cluster.json's roles, epochs and controller
leader current while the cluster runs.

`mqgw cluster up` starts it (as the member "watcher") when the cluster has replicated groups
or controllers, and `down` stops it first. Every ``POLL_S`` it reads the controller's keys in
Redis (localcluster/roles.py); when what they say differs from cluster.json, it takes the
cluster lock without waiting, reads cluster.json again under it (a command may have changed
pids meanwhile), sets only the role fields and writes the file atomically. A failover shows
in cluster.json within a poll of the controller's decision. While a command holds the lock
it skips: the command refreshes the roles itself before it writes.

It logs one line per change and exits 0 on SIGTERM/SIGINT, or when cluster.json is gone.
"""

from __future__ import annotations

import signal
import sys
import threading
from pathlib import Path
from types import FrameType

from localcluster import roles
from localcluster.control import try_locked
from localcluster.layout import STATE_FILE, ClusterError, load

POLL_S = 0.2


def _say(text: str) -> None:
    print(text, flush=True)  # its stdout is its log file


def watch(directory: Path, stop: threading.Event) -> None:
    _say(f"watching {directory / STATE_FILE} every {POLL_S * 1000:.0f} ms")
    client = None
    unreachable = False
    while not stop.wait(POLL_S):
        if not (directory / STATE_FILE).exists():
            _say(f"{directory / STATE_FILE} is gone: stopping")
            return
        try:
            cluster = load(directory)
        except ClusterError as error:  # half-replaced by hand, say: try again next round
            _say(f"cannot read the cluster: {error}")
            continue
        client = client or roles.connect(cluster.meta_url)
        try:
            observed = roles.observe(client, cluster)
        except roles.REDIS_DOWN as error:
            if not unreachable:
                _say(f"Redis does not answer ({error}): roles kept as they are")
            unreachable = True
            continue
        if unreachable:
            _say("Redis answers again")
            unreachable = False
        if not roles.apply(cluster, observed):
            continue  # cluster.json already says so
        with try_locked(directory) as held:
            if not held:
                continue  # a command runs; it refreshes before it writes
            try:
                current = load(directory)
            except ClusterError:
                continue  # gone or unreadable: the next round says which
            changes = roles.apply(current, observed)
            if changes:
                current.save()
                for change in changes:
                    _say(change)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m localcluster.watch D", file=sys.stderr)
        return 2
    stop = threading.Event()

    def on_signal(_number: int, _frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    watch(Path(argv[1]).resolve(), stop)
    _say("watcher stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
