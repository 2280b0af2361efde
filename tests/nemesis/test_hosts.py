"""The hosts the nemesis works on (tests/harness/hosts.py): each in its own network namespace
with its own address; a cut drops packets both ways (connects time out, as in a real
partition), a bridge partition leaves A-B and B-C but not A-C, heal restores everything, and
nothing is left on the machine afterwards, even when the test fails."""

from __future__ import annotations

import random
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


SINKS = (
    "import socket, threading\n"
    "def tcp():\n"
    "    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
    f"    s.bind(('0.0.0.0', {PORT + 2})); s.listen(8)\n"
    "    while True:\n"
    "        c, _ = s.accept()\n"
    "        while c.recv(65536): pass\n"
    "        c.sendall(b'done'); c.close()\n"
    "threading.Thread(target=tcp, daemon=True).start()\n"
    "u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
    f"u.bind(('0.0.0.0', {PORT + 1})); n = 0\n"
    "while True:\n"
    "    data, peer = u.recvfrom(100)\n"
    "    if data == b'count?':\n"
    "        u.sendto(str(n).encode(), peer)\n"
    "    else:\n"
    "        n += 1\n"
)


def _on(net: Hosts, here: str, code: str) -> str:
    done = subprocess.run(
        net.command(here, [sys.executable, "-c", code]), capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_a_degraded_link_loses_and_slows() -> None:
    with hosts(["a", "b"]) as net:
        net.start("a", [sys.executable, "-c", SINKS])
        to = net.addresses["a"]
        send = (
            "import socket, time\n"
            "u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
            f"for _ in range(400): u.sendto(b'x', ({to!r}, {PORT + 1})); time.sleep(0.001)\n"
        )
        count = (
            "import socket\n"
            "u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.settimeout(2)\n"
            f"u.sendto(b'count?', ({to!r}, {PORT + 1})); print(u.recv(100).decode())\n"
        )
        bulk = (
            "import socket, time\n"
            f"c = socket.create_connection(({to!r}, {PORT + 2}), timeout=20)\n"
            "t = time.monotonic(); c.sendall(b'x' * 200_000); c.shutdown(socket.SHUT_WR)\n"
            "assert c.recv(4) == b'done'; print(time.monotonic() - t)\n"
        )
        check_for(10, lambda: _on(net, "b", count) == "0")
        net.degrade("b", 0.5, 8000)
        _on(net, "b", send)
        net.heal()  # restores every degraded host
        assert 120 < int(_on(net, "b", count)) < 280  # about half of the 400 arrived
        net.degrade("b", 0.0, 1000)  # 125 KB/s: 200 KB take over a second
        assert float(_on(net, "b", bulk)) > 1.0
        net.restore("b")
        assert float(_on(net, "b", bulk)) < 0.5
    assert not [n for n in leftovers() if n.startswith(net.tag)]


def test_a_second_topology_never_takes_a_subnet_in_use(monkeypatch: pytest.MonkeyPatch) -> None:
    """Seeds 145 and 146, run at once, drew the same subnet and talked to each other's
    gateways. Here every draw would pick the first topology's subnet: the second one must
    still get another."""
    with hosts(["a"]) as first:
        taken = first.subnet
        monkeypatch.setattr(random, "randrange", lambda *_args: taken)
        monkeypatch.setattr(
            random.SystemRandom, "choice", lambda _self, seq: taken if taken in seq else seq[0]
        )
        assert Hosts(["b"]).subnet != taken
