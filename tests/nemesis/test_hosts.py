"""The hosts the nemesis works on (tests/harness/hosts.py): each in its own network namespace
with its own address; a cut drops packets both ways (connects time out, as in a real
partition), a bridge partition leaves A-B and B-C but not A-C, heal restores everything, and
nothing is left on the machine afterwards, even when the test fails."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from bench.servers import check_for
from localcluster.nemesis.hosts import Hosts, hosts, leftovers

PORT = 7000
LISTEN = (
    "import socket\n"
    "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
    f"s.bind(('0.0.0.0', {PORT})); s.listen(64)\n"  # inside its own namespace only
    "while True:\n"
    "    c, _ = s.accept(); c.close()\n"
)


def reaches(net: Hosts, here: str, there: str) -> bool:
    probe = (
        "import socket, sys\n"
        "try:\n"
        f"    socket.create_connection(({net.addresses[there]!r}, {PORT}), timeout=0.5)\n"
        "except OSError:\n"
        "    sys.exit(1)\n"
    )
    done = subprocess.run(net.command(here, [sys.executable, "-c", probe]), timeout=10)
    return done.returncode == 0


def test_cuts_partitions_and_heal() -> None:
    with hosts(["a", "b", "c"]) as net:
        assert len(set(net.addresses.values())) == 3
        assert all(address.startswith("10.231.") for address in net.addresses.values())
        for name in net.names:
            net.start(name, [sys.executable, "-c", LISTEN])
        check_for(10, lambda: all(reaches(net, x, y) for x in "abc" for y in "abc" if x != y))
        net.cut("a", "c")  # a bridge partition: b still sees both
        assert reaches(net, "a", "b") and reaches(net, "b", "c")
        assert not reaches(net, "a", "c") and not reaches(net, "c", "a")
        net.heal()
        assert reaches(net, "a", "c")
        net.isolate("b")
        assert not reaches(net, "a", "b") and not reaches(net, "c", "b")
        assert reaches(net, "a", "c")
        net.heal()
        net.partition(["a"], ["b", "c"])
        assert not reaches(net, "a", "b") and not reaches(net, "a", "c") and reaches(net, "b", "c")
        net.heal()
        assert all(reaches(net, x, y) for x in "abc" for y in "abc" if x != y)
        # The machine itself reaches every host through the bridge, cuts or not.
        net.isolate("a")
        with socket.create_connection((net.addresses["a"], PORT), timeout=2):
            pass
    assert not [n for n in leftovers() if n.startswith(net.tag)]


def test_nothing_is_left_when_the_test_fails() -> None:
    with pytest.raises(RuntimeError, match="on purpose"), hosts(["x", "y"]) as net:
        net.start("x", [sys.executable, "-c", LISTEN])
        net.cut("x", "y")
        raise RuntimeError("on purpose")
    assert not [n for n in leftovers() if n.startswith(net.tag)]
    assert all(proc.poll() is not None for proc in net.procs) and not net.procs
